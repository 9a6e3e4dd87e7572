"""Shared pieces of every figure spec: colours and markers, traces, layout, escaping,
compact numbers, and the chart entries the pages list.

Figure builders return ``figure(title, traces, layout, note)``: plotly's ``data`` and
``layout`` plus the title and a note as plain text. A page lists charts as ``chart(...)``
entries, ``{id, sweep, kind, title, note, figure}``, and shows the title and note as HTML
above each chart (they wrap on a phone, and plotly's toolbar never covers them); the
figure's own ``layout.title`` carries the same text for the PNG export, which draws it
into the image.

Plotly renders a subset of HTML inside text (titles, legend names, annotations, hover
labels: ``<b>``, ``<br>``, ``<a href>``...). Every string a user chose (run names,
backend names, sweep names) goes through ``esc`` so it shows as text; plotly turns the
entities back into the characters when it draws them. Titles and notes are plain text
here, escaped by ``figure``. User strings never go into a ``hovertemplate`` (whose
``%{...}`` would be read as placeholders); hover labels show the trace name.

Every trace is a ``scatter``: the page loads plotly.js's basic bundle, which has no other
trace type we use (``TRACE_TYPES``; a test keeps the two in step).
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TRACE_TYPES = ("scatter",)

AXIS_TITLES = {
    "max_concurrency": "Concurrency (requests in flight)",
    "input_len": "Prompt length (tokens)",
    "output_len": "Output length (tokens)",
    "request_rate": "Request rate (req/s)",
    "num_prompts": "Number of prompts",
}
AXIS_SHORT = {
    "max_concurrency": "c",
    "input_len": "in",
    "output_len": "out",
    "request_rate": "rate",
    "num_prompts": "n",
}
# One colour per backend (run page) or run (compare page): distinct hues that stay apart
# for the common colour-vision deficiencies, each paired with its own marker.
PALETTE = ["#2563eb", "#d97706", "#059669", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#4b5563"]
SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "cross", "star", "pentagon"]
HF_COLOR = "#6b7280"
WARN_COLOR = "#b91c1c"
GOOD_COLOR = "#15803d"
NOTE_COLOR = "#b45309"
GRID_COLOR = "#e5e7eb"
INK = "#1b1f24"
FONT = 'system-ui, -apple-system, "Segoe UI", Roboto, sans-serif'


@dataclass(frozen=True)
class Style:
    """How one line looks: colour, marker and dash together, so no two lines of a chart
    differ by one of them alone."""

    colour: str
    symbol: str = "circle"
    dash: str = "solid"


# Several lines of one backend on one chart (p50/p90/p99; requests/s and tokens/s): each
# its own colour, marker and dash.
STAT_STYLES = {
    "p50": Style("#2563eb", "circle", "solid"),
    "p90": Style("#d97706", "square", "dash"),
    "p99": Style("#dc2626", "diamond", "dot"),
}
SECOND_STYLE = Style("#0d9488", "diamond", "dash")  # the right axis' line, beside PALETTE[0]


def esc(text: Any) -> str:
    """A user string made safe for plotly's HTML-ish text rendering."""
    return html.escape(str(text), quote=False)


def compact(value: float | None) -> float | None:
    """Five significant digits: enough for a chart, and a much smaller page."""
    if value is None:
        return None
    return float(f"{value:.5g}")


def compact_list(values: Sequence[float | None]) -> list[float | None]:
    return [compact(v) for v in values]


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def symbol(i: int) -> str:
    return SYMBOLS[i % len(SYMBOLS)]


def style(i: int) -> Style:
    """The i-th backend's (or run's) colour with its own marker."""
    return Style(color(i), symbol(i))


def measured(values: Sequence[float | None]) -> bool:
    """Whether a line would say anything: some value present and not zero (a line of
    zeros is what a metric looks like where nothing measured it)."""
    return any(v is not None and v != 0 for v in values)


LOG_AXES = ("max_concurrency", "request_rate", "num_prompts")


def log_x(xs: Sequence[float], axis: str = "max_concurrency") -> bool:
    """Load levels (1, 2, 4 ... 256) read best on a log axis; lengths on a linear one."""
    return axis in LOG_AXES and len(xs) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 16


def ax(x: float, logx: bool) -> float:
    """An annotation's x: plotly wants log10(x) on a log axis."""
    return math.log10(x) if logx and x > 0 else x


def x_ticks(xs: Sequence[float]) -> dict[str, Any]:
    """Ticks exactly at the measured values (when there are few), so a log axis reads
    1, 2, 4, 8 ... instead of 1, 2, 5, 10."""
    values = sorted(set(xs))
    if not values or len(values) > 12:
        return {}
    text = [str(int(v)) if float(v).is_integer() else f"{v:g}" for v in values]
    return {"tickmode": "array", "tickvals": values, "ticktext": text}


def trace(
    name: str,
    xs: Sequence[Any],
    ys: Sequence[float | None],
    look: Style,
    hover: str,
    *,
    errors: Sequence[float | None] | None = None,
    yaxis: str | None = None,
    width: float = 2,
    size: int = 7,
    mode: str = "lines+markers",
    **extra: Any,
) -> dict[str, Any]:
    """One line of a chart. ``name`` is shown as text (escaped here); ``hover`` is our own
    hovertemplate; ``errors`` (a standard deviation per point) draws error bars when any
    is non-zero."""
    out: dict[str, Any] = {
        "type": "scatter",
        "mode": mode,
        "name": esc(name),
        "x": list(xs),
        "y": compact_list(ys),
        "line": {"color": look.colour, "dash": look.dash, "width": width},
        "marker": {"color": look.colour, "symbol": look.symbol, "size": size},
        "hovertemplate": hover,
    }
    if errors is not None and any(errors):
        out["error_y"] = {
            "type": "data",
            "array": compact_list(errors),
            "visible": True,
            "thickness": 1.2,
            "width": 3,
        }
    if yaxis:
        out["yaxis"] = yaxis
    out.update(extra)
    return out


def reference(name: str, x0: float, x1: float, y: float, colour: str, hover: str) -> dict[str, Any]:
    """A horizontal dashed reference line across the measured range (the HF baseline)."""
    return {
        "type": "scatter",
        "mode": "lines",
        "name": esc(name),
        "x": [x0, x1],
        "y": [compact(y), compact(y)],
        "line": {"color": colour, "dash": "dash", "width": 1.5},
        "hovertemplate": hover,
    }


def layout(
    xtitle: str,
    ytitle: str,
    logx: bool = False,
    xs: Sequence[float] | None = None,
) -> dict[str, Any]:
    """A chart's layout; the axis titles are plain text (escaped here). The legend sits
    under the plot, left-aligned, so it wraps on a phone instead of covering the lines;
    the top margin holds plotly's toolbar alone (the title is the page's, see
    ``figure``)."""
    return {
        "font": {"family": FONT, "size": 12, "color": INK},
        "xaxis": {
            "title": {"text": esc(xtitle), "standoff": 6},
            "type": "log" if logx else "linear",
            "gridcolor": GRID_COLOR,
            "zeroline": False,
            "automargin": True,
            **x_ticks(xs or []),
        },
        "yaxis": {
            "title": {"text": esc(ytitle), "standoff": 6},
            "rangemode": "tozero",
            "gridcolor": GRID_COLOR,
            "zeroline": False,
            "automargin": True,
        },
        "margin": {"l": 56, "r": 16, "t": 28, "b": 40},
        "legend": {
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "y": -0.2,
            "yanchor": "top",
            "font": {"size": 11},
        },
        "showlegend": True,
        "hovermode": "closest",
        "plot_bgcolor": "#fff",
        "paper_bgcolor": "#fff",
    }


def figure(
    title: str, traces: list[dict[str, Any]], fig_layout: dict[str, Any], note: str = ""
) -> dict[str, Any]:
    """A figure with its title and note as plain text (the page shows them above the
    chart); ``layout.title`` gets the same, escaped, for the PNG export."""
    text = esc(title) + (f"<br><sub>{esc(note)}</sub>" if note else "")
    fig_layout["title"] = {"text": text, "font": {"size": 15}, "x": 0.01, "xanchor": "left"}
    return {"title": title, "note": note, "data": traces, "layout": fig_layout}


def right_axis(title: str, **extra: Any) -> dict[str, Any]:
    """A second y axis on the right with its own round ticks."""
    return {
        "title": {"text": esc(title), "standoff": 6},
        "overlaying": "y",
        "side": "right",
        "rangemode": "tozero",
        "showgrid": False,
        "zeroline": False,
        "tickmode": "auto",
        "nticks": 6,
        "automargin": True,
        **extra,
    }


def vline(x: float, text: str, colour: str, dash: str = "dot", row: int = 0) -> tuple[dict, dict]:
    """A vertical marker line with a label near the bottom, one row per marker so the
    labels of nearby lines stack instead of overlapping (shape, annotation)."""
    shape = {
        "type": "line",
        "xref": "x",
        "yref": "paper",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"color": colour, "width": 1.5, "dash": dash},
    }
    note = {
        "x": x,
        "xref": "x",
        "yref": "paper",
        "y": 0.02 + 0.09 * row,
        "yanchor": "bottom",
        "text": esc(text),
        "showarrow": False,
        "xanchor": "left",
        "font": {"size": 10, "color": colour},
        "bgcolor": "rgba(255,255,255,0.85)",
    }
    return shape, note


def spaced(
    points: Sequence[tuple[float, float]],
    logx: bool = False,
    min_dx: float = 0.08,
    min_dy: float = 0.1,
) -> list[int]:
    """Indices of the points whose labels can be drawn without overlapping: a point is
    kept when, on the chart's own scale (fractions of each axis' range), it is at least
    ``min_dx`` across or ``min_dy`` up from every point kept before it. Points are taken
    in the given order, so put the ones that matter most first."""
    if not points:
        return []
    xs = [math.log10(x) if logx and x > 0 else x for x, _ in points]
    ys = [y for _, y in points]
    width = (max(xs) - min(xs)) or 1.0
    height = (max(ys) - min(0.0, min(ys))) or 1.0
    kept: list[int] = []
    for i in range(len(points)):
        if all(
            abs(xs[i] - xs[j]) / width >= min_dx or abs(ys[i] - ys[j]) / height >= min_dy
            for j in kept
        ):
            kept.append(i)
    return kept


def chart(chart_id: str, sweep: str, kind: str, fig: dict[str, Any]) -> dict[str, Any]:
    """The entry a page lists for one chart (see the module docstring)."""
    return {
        "id": chart_id,
        "sweep": sweep,
        "kind": kind,
        "title": fig.get("title", ""),
        "note": fig.get("note", ""),
        "figure": {"data": fig["data"], "layout": fig["layout"]},
    }


def by_sweep(
    items: Sequence[dict[str, Any]], missing: Sequence[dict[str, str]] = ()
) -> list[dict[str, Any]]:
    """Chart entries (and notes on what was not drawn, ``{sweep, text}``) grouped by sweep
    in page order: ``[{sweep, charts, missing}]``, what the chart grid template lists."""
    order = list(dict.fromkeys([c["sweep"] for c in items] + [m["sweep"] for m in missing]))
    return [
        {
            "sweep": s,
            "charts": [c for c in items if c["sweep"] == s],
            "missing": [m["text"] for m in missing if m["sweep"] == s],
        }
        for s in order
    ]
