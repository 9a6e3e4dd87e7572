"""The history chart: one metric at one point, one marker per run, in time order.

Each marker carries its run's URL (``customdata``; a click opens the run); a dotted
vertical line marks each run whose software versions changed from the previous one's.
Lines are drawn for every change; labels only for the latest ``MAX_LABELS`` and only
where they do not run into one another (``common.spaced``), so a long history stays
readable; every change is also in the table under the chart.

The x axis is the runs in submission order, one slot each, labelled with when each was
submitted (to the minute; the run's id where two share a minute): on a time axis runs
submitted seconds apart would sit on one x, and a single run would get ticks in
milliseconds.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from portal.benchmarks.history import History
from portal.benchmarks.points import display_value
from portal.web.figures.common import NOTE_COLOR, Style, esc, figure, layout, trace
from portal.web.tables import heading

MAX_LABELS = 25
LABEL_ROWS = 4


def _slots(points: list[Any]) -> list[str]:
    """One x label per run, unique, in order: its submission time to the minute, with
    the run's id when another run shares that minute."""
    minutes = [p.created_at.strftime("%Y-%m-%d %H:%M") for p in points]
    shared = {m for m, n in Counter(minutes).items() if n > 1}
    return [
        f"{m} · {p.public_id[:8]}" if m in shared else m
        for m, p in zip(minutes, points, strict=True)
    ]


def history_figure(history: History) -> dict[str, Any]:
    metric = history.metric
    pts = history.points
    times = _slots(pts)
    line = trace(
        metric.label,
        times,
        [display_value(metric.key, p.value) for p in pts],
        Style("#2563eb"),
        f"%{{text}}<br>%{{y:,.2f}} {metric.unit}<br>%{{x}}<extra></extra>",
        errors=[display_value(metric.key, p.std) or 0.0 for p in pts],
        size=8,
        customdata=[p.url for p in pts],
        text=[esc(p.name) for p in pts],
    )
    line["line"] = {"color": "#93c5fd", "width": 1.5}
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    changed = [i for i, p in enumerate(pts) if p.changes]
    for i in changed:
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": times[i],
                "x1": times[i],
                "y0": 0,
                "y1": 1,
                "line": {"color": NOTE_COLOR, "width": 1, "dash": "dot"},
            }
        )
    last_x: list[float | None] = [None] * LABEL_ROWS  # where each row's last label sits
    for n, i in enumerate(changed[-MAX_LABELS:]):
        p = pts[i]
        at = i / (len(pts) - 1) if len(pts) > 1 else 0.5
        row = n % LABEL_ROWS
        previous = last_x[row]
        if previous is not None and at - previous < 0.18:
            continue  # would run into the label before it in this row: the line stays
        last_x[row] = at
        late = at > 0.5  # label to the left of the line in the right half
        annotations.append(
            {
                "x": times[i],
                "xref": "x",
                "yref": "paper",
                "y": 1.0 - 0.07 * row,
                "yanchor": "top",
                "text": esc("; ".join(p.changes)),
                "showarrow": False,
                "xanchor": "right" if late else "left",
                "font": {"size": 10, "color": NOTE_COLOR},
                "bgcolor": "rgba(255,255,255,0.85)",
            }
        )
    label, unit = heading(metric)
    fig_layout = layout("Run submitted", f"{label} ({unit})" if unit else label)
    fig_layout["xaxis"] = {
        "title": {"text": "Run submitted (UTC, in order)", "standoff": 6},
        "type": "category",
        "categoryorder": "array",
        "categoryarray": times,
        "gridcolor": "#e5e7eb",
        "automargin": True,
        "tickangle": -30,
        "nticks": 12,
    }
    fig_layout["shapes"] = shapes
    fig_layout["annotations"] = annotations
    fig_layout["showlegend"] = False
    title = f"{metric.label} at {history.point_key} ({history.backend})"
    note = "one marker per run; dotted lines: software versions changed"
    return figure(title, [line], fig_layout, note)
