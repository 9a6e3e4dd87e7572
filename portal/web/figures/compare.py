"""The compare page's charts: every run's curves overlaid, one colour per run.

Per sweep name: output tokens/s (HF baselines as dashed lines in the run's colour), p99
TTFT, p99 TPOT, and throughput against p99 TTFT for load sweeps. Numbers are rounded to
five significant digits: 8 runs x 20 points stay far below 200 kB of chart data.
"""

from __future__ import annotations

from typing import Any

from portal.benchmarks.compare import Comparison
from portal.web.figures.common import (
    AXIS_SHORT,
    AXIS_TITLES,
    color,
    compact,
    compact_list,
    esc,
    layout,
    log_x,
)
from portal.web.figures.run import LOAD_AXES, PARETO_LATENCY

CHARTS = (
    ("output", "output_throughput", "Output tokens/s", "tok/s"),
    ("ttft", "p99_ttft_ms", "p99 time to first token", "ms"),
    ("tpot", "p99_tpot_ms", "p99 time per output token", "ms"),
)


def _series_label(comparison: Comparison, i: int, backend: str, several: bool) -> str:
    name = comparison.columns[i].label
    return esc(f"{name} · {backend}" if several else name)


def compare_figures(comparison: Comparison) -> list[dict[str, Any]]:
    """[{id, sweep, kind, figure}] for the compare page."""
    sweeps = list(dict.fromkeys(p.sweep for p in comparison.points if p.axis))
    out = []
    for sweep in sweeps:
        axis = next(p.axis for p in comparison.points if p.sweep == sweep and p.axis)
        for kind, key, title, unit in CHARTS:
            figure = _overlay(comparison, sweep, axis, key, f"{title} ({esc(sweep)})", unit)
            if figure["data"]:
                out.append(
                    {"id": f"{sweep}-{kind}", "sweep": sweep, "kind": kind, "figure": figure}
                )
        if axis in LOAD_AXES:
            figure = _pareto(comparison, sweep, axis)
            if figure["data"]:
                out.append(
                    {"id": f"{sweep}-pareto", "sweep": sweep, "kind": "pareto", "figure": figure}
                )
    return out


def _overlay(
    comparison: Comparison, sweep: str, axis: str, key: str, title: str, unit: str
) -> dict[str, Any]:
    traces: list[dict[str, Any]] = []
    all_x: set[float] = set()
    for i, column in enumerate(comparison.columns):
        backends = sorted({b for (b, _), p in column.points.items() if p.sweep == sweep})
        for backend in backends:
            pts = sorted(
                (p for (b, _), p in column.points.items() if b == backend and p.sweep == sweep),
                key=lambda p: p.x,
            )
            pts = [p for p in pts if p.get(key) is not None]
            if not pts:
                continue
            all_x.update(p.x for p in pts)
            width = 3 if i == comparison.baseline else 2
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": _series_label(comparison, i, backend, len(backends) > 1),
                    "x": [p.x for p in pts],
                    "y": compact_list([p.get(key) for p in pts]),
                    "error_y": {
                        "type": "data",
                        "array": compact_list([p.std.get(key, 0.0) for p in pts]),
                        "visible": True,
                        "thickness": 1,
                    },
                    "line": {"color": color(i), "width": width},
                    "hovertemplate": f"%{{x}}: %{{y:,.1f}} {unit}",
                }
            )
    several = any(
        len({b for (b, _), p in c.points.items() if p.sweep == sweep and p.backend_kind == "vllm"})
        > 1
        for c in comparison.columns
    )
    if key == "output_throughput" and all_x:
        lo, hi = min(all_x), max(all_x)
        for i, column in enumerate(comparison.columns):
            base = next(iter(column.results.baselines.values()), None)
            ref = base.get(key) if base else None
            if ref:
                traces.append(
                    {
                        "type": "scatter",
                        "mode": "lines",
                        "name": esc(f"{column.label} · HF baseline"),
                        "x": [lo, hi],
                        "y": [compact(ref), compact(ref)],
                        "line": {"color": color(i), "dash": "dash", "width": 1},
                        "showlegend": several,
                        "hovertemplate": f"%{{y:,.1f}} {unit}",
                    }
                )
    xs = sorted(all_x)
    if key == "output_throughput":
        title += "<br><sub>dashed: each run's HF sequential baseline</sub>"
    fig = layout(title, esc(AXIS_TITLES.get(axis, axis)), unit, log_x(xs, axis), xs)
    # Colours are the runs table's swatches; a legend only when a run has several backends.
    fig["showlegend"] = several
    return {"data": traces, "layout": fig}


def _pareto(comparison: Comparison, sweep: str, axis: str) -> dict[str, Any]:
    traces = []
    short = AXIS_SHORT.get(axis, "")
    for i, column in enumerate(comparison.columns):
        pts = sorted(
            (
                p
                for p in column.points.values()
                if p.sweep == sweep
                and p.get(PARETO_LATENCY) is not None
                and p.get("output_throughput") is not None
            ),
            key=lambda p: p.x,
        )
        if not pts:
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": esc(column.label),
                "x": compact_list([p.get(PARETO_LATENCY) for p in pts]),
                "y": compact_list([p.get("output_throughput") for p in pts]),
                "customdata": [p.x for p in pts],
                "line": {"color": color(i), "width": 3 if i == comparison.baseline else 2},
                "hovertemplate": f"{short}=%{{customdata}}: %{{y:,.1f}} tok/s at %{{x:,.0f}} ms",
            }
        )
    fig = layout(f"Throughput against TTFT ({esc(sweep)})", "p99 TTFT (ms)", "Output tokens/s")
    fig["xaxis"]["rangemode"] = "tozero"
    fig["showlegend"] = False
    return {"data": traces, "layout": fig}
