"""The history chart: one metric at one point, one marker per run, in time order.

Each marker carries its run's URL (``customdata``; a click opens the run); a dotted
vertical line with a label marks each run whose software versions changed from the
previous one's (at most ``MAX_LABELS`` labels, the latest ones, so a long history stays
readable).
"""

from __future__ import annotations

from typing import Any

from portal.benchmarks.history import History
from portal.benchmarks.points import display_value
from portal.web.figures.common import NOTE_COLOR, compact, esc, layout

MAX_LABELS = 25


def history_figure(history: History) -> dict[str, Any]:
    metric = history.metric
    pts = history.points
    ys = [compact(display_value(metric.key, p.value)) for p in pts]
    errs = [compact(display_value(metric.key, p.std)) for p in pts]
    trace = {
        "type": "scatter",
        "mode": "lines+markers",
        "name": esc(metric.label),
        "x": [p.created_at.isoformat(timespec="seconds") for p in pts],
        "y": ys,
        "error_y": {"type": "data", "array": errs, "visible": True, "thickness": 1},
        "customdata": [p.url for p in pts],
        "text": [esc(p.name) for p in pts],
        "marker": {"size": 8, "color": "#2563eb"},
        "line": {"color": "#93c5fd"},
        "hovertemplate": f"%{{text}}<br>%{{y:,.2f}} {metric.unit}<br>%{{x}}<extra></extra>",
    }
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    changed = [p for p in pts if p.changes][-MAX_LABELS:]
    position = {id(p): i for i, p in enumerate(pts)}
    for n, p in enumerate(changed):
        late = position[id(p)] > len(pts) / 2  # label to the left of the line near the end
        x = p.created_at.isoformat(timespec="seconds")
        shapes.append(
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": x,
                "x1": x,
                "y0": 0,
                "y1": 1,
                "line": {"color": NOTE_COLOR, "width": 1, "dash": "dot"},
            }
        )
        annotations.append(
            {
                "x": x,
                "xref": "x",
                "yref": "paper",
                "y": 1.0 - 0.06 * (n % 4),
                "text": esc("; ".join(p.changes)),
                "showarrow": False,
                "xanchor": "right" if late else "left",
                "font": {"size": 10, "color": NOTE_COLOR},
                "bgcolor": "rgba(255,255,255,0.85)",
            }
        )
    unit = f" ({metric.unit})" if metric.unit else ""
    fig = layout(
        esc(f"{metric.label} at {history.point_key} ({history.backend})"),
        "Run submitted",
        f"{metric.label}{unit}",
    )
    fig["xaxis"] = {"title": {"text": "Run submitted"}, "type": "date"}
    fig["shapes"] = shapes
    fig["annotations"] = annotations
    fig["showlegend"] = False
    return {"data": [trace], "layout": fig}
