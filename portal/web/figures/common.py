"""Shared pieces of every figure spec: colours, layout, escaping, compact numbers.

Plotly renders a subset of HTML inside text (titles, legend names, annotations, hover
labels: ``<b>``, ``<br>``, ``<a href>``...). Every string a user chose (run names,
backend names) goes through ``esc`` so it shows as text; plotly turns the entities back
into the characters when it draws them. User strings never go into a ``hovertemplate``
(whose ``%{...}`` would be read as placeholders); hover labels show the trace name.
"""

from __future__ import annotations

import html
from typing import Any

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
PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"]
HF_COLOR = "#6b7280"
WARN_COLOR = "#b91c1c"
GOOD_COLOR = "#15803d"
NOTE_COLOR = "#b45309"


def esc(text: Any) -> str:
    """A user string made safe for plotly's HTML-ish text rendering."""
    return html.escape(str(text), quote=False)


def compact(value: float | None) -> float | None:
    """Five significant digits: enough for a chart, and a much smaller page."""
    if value is None:
        return None
    return float(f"{value:.5g}")


def compact_list(values: list[float | None]) -> list[float | None]:
    return [compact(v) for v in values]


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


LOG_AXES = ("max_concurrency", "request_rate", "num_prompts")


def log_x(xs: list[float], axis: str = "max_concurrency") -> bool:
    """Load levels (1, 2, 4 ... 256) read best on a log axis; lengths on a linear one."""
    return axis in LOG_AXES and len(xs) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 16


def x_ticks(xs: list[float]) -> dict[str, Any]:
    """Ticks exactly at the measured values (when there are few), so a log axis reads
    1, 2, 4, 8 ... instead of 1, 2, 5, 10."""
    values = sorted(set(xs))
    if not values or len(values) > 12:
        return {}
    text = [str(int(v)) if float(v).is_integer() else f"{v:g}" for v in values]
    return {"tickmode": "array", "tickvals": values, "ticktext": text}


def layout(
    title: str, xtitle: str, ytitle: str, logx: bool = False, xs: list[float] | None = None
) -> dict[str, Any]:
    """Titles are ours (never user text unless escaped by the caller)."""
    return {
        "title": {"text": title, "font": {"size": 15}},
        "xaxis": {
            "title": {"text": xtitle},
            "type": "log" if logx else "linear",
            **x_ticks(xs or []),
        },
        "yaxis": {"title": {"text": ytitle}, "rangemode": "tozero"},
        "margin": {"l": 60, "r": 30, "t": 50, "b": 50},
        "legend": {"orientation": "h", "y": -0.22},
        "hovermode": "closest",
        "template": "plotly_white",
    }


def right_axis(title: str, **extra: Any) -> dict[str, Any]:
    """A second y axis on the right with its own round ticks."""
    return {
        "title": {"text": title},
        "overlaying": "y",
        "side": "right",
        "rangemode": "tozero",
        "showgrid": False,
        "tickmode": "auto",
        "nticks": 6,
        **extra,
    }


def vline(x: float, text: str, colour: str, dash: str = "dot", row: int = 0) -> tuple[dict, dict]:
    """A vertical marker line with a label at the top (shape, annotation)."""
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
        "y": 0.02 + 0.08 * row,
        "yanchor": "bottom",
        "text": text,
        "showarrow": False,
        "xanchor": "left",
        "font": {"size": 10, "color": colour},
        "bgcolor": "rgba(255,255,255,0.8)",
    }
    return shape, note
