"""The compare page's charts: every run's curves overlaid, one colour and one marker per
run (the runs table's swatch), each named in the legend, the reference run drawn thicker
and named as such.

Per sweep name: output tokens/s (each run's HF baseline as a dashed line in the run's
colour, in the run's legend group), p99 TTFT, p99 TPOT, and throughput against p99 TTFT
for load sweeps. Numbers are rounded to five significant digits: 8 runs x 20 points stay
far below 200 kB of chart data.
"""

from __future__ import annotations

from typing import Any

from portal.benchmarks import points as pts
from portal.benchmarks.compare import Column, Comparison
from portal.web.figures.common import (
    AXIS_SHORT,
    AXIS_TITLES,
    Style,
    chart,
    figure,
    layout,
    log_x,
    reference,
    style,
    trace,
)

CHARTS = (
    ("output", "output_throughput", "Output tokens/s", "tok/s"),
    ("ttft", "p99_ttft_ms", "p99 time to first token", "ms"),
    ("tpot", "p99_tpot_ms", "p99 time per output token", "ms"),
)
NAME_CHARS = 32  # legend names are cut to this many characters (the table has the rest)


def run_name(comparison: Comparison, i: int) -> str:
    """A run's legend name: its name (cut) and short id, ", reference" for the reference."""
    column = comparison.columns[i]
    name = column.run.name or column.run.model_id
    if len(name) > NAME_CHARS:
        name = name[: NAME_CHARS - 1] + "…"
    tail = ", reference" if i == comparison.baseline else ""
    return f"{name} ({column.run.short_id}{tail})"


def _look(comparison: Comparison, i: int) -> tuple[Style, float]:
    return style(i), 3.0 if i == comparison.baseline else 1.8


def _backends(column: Column, sweep: str) -> list[str]:
    return sorted({b for (b, _), p in column.points.items() if p.sweep == sweep})


def compare_figures(comparison: Comparison) -> list[dict[str, Any]]:
    """``common.chart`` entries for the compare page."""
    sweeps = list(dict.fromkeys(p.sweep for p in comparison.points if p.axis))
    out = []
    for sweep in sweeps:
        axis = next(p.axis for p in comparison.points if p.sweep == sweep and p.axis)
        for kind, key, title, unit in CHARTS:
            fig = _overlay(comparison, sweep, axis, key, f"{title} ({sweep})", unit)
            if fig["data"]:
                out.append(chart(f"{sweep}-{kind}", sweep, kind, fig))
        if axis in pts.LOAD_AXES:
            fig = _pareto(comparison, sweep, axis)
            if fig["data"]:
                out.append(chart(f"{sweep}-pareto", sweep, "pareto", fig))
    fig = efficiency_figure(comparison)
    if fig["data"]:
        out.append(chart("configurations-front", "configurations", "front", fig))
    return out


def efficiency_figure(comparison: Comparison) -> dict[str, Any]:
    """Throughput per GPU against throughput per user, every load point of every
    comparable run (``Comparison.efficiency``), the Pareto front over all of them drawn
    through: the configuration on the front at the interactivity a team needs is the one
    to deploy. Empty with fewer than two runs' points."""
    entries = comparison.efficiency()
    if len(entries) < 2:
        return figure("", [], layout("", ""))
    traces = []
    front: list[tuple[float, float, str]] = []
    for entry in entries:
        i = entry["index"]
        look, width = _look(comparison, i)
        ordered = sorted(zip(entry["points"], entry["front"], strict=True), key=lambda e: e[0][0])
        name = run_name(comparison, i)
        traces.append(
            trace(
                name,
                [xy[0] for (xy, _, _), _ in ordered],
                [xy[1] for (xy, _, _), _ in ordered],
                look,
                "%{customdata}: %{y:,.1f} tok/s/GPU at %{x:,.1f} tok/s/user",
                width=width,
                customdata=[p.short for (_, p, _), _ in ordered],
                legendgroup=f"run{i}",
            )
        )
        front += [(xy[0], xy[1], name) for (xy, _, _), on in ordered if on]
    front.sort()
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "Pareto front",
            "x": [f[0] for f in front],
            "y": [f[1] for f in front],
            "line": {"color": "#111", "dash": "dot", "width": 1.2},
            "hoverinfo": "skip",
        }
    )
    gpus = max((comparison.columns[e["index"]].gpus for e in entries), default=0)
    per = "GPU" if gpus else "server (CPU run)"
    fig_layout = layout(
        "Output tokens/s per user (1000 / median TPOT)", f"Output tokens/s per {per}"
    )
    fig_layout["xaxis"]["rangemode"] = "tozero"
    note = "each point a load level; up and to the right is better; dotted: the Pareto front"
    return figure("Configurations: throughput per GPU against per user", traces, fig_layout, note)


def _overlay(
    comparison: Comparison, sweep: str, axis: str, key: str, title: str, unit: str
) -> dict[str, Any]:
    traces: list[dict[str, Any]] = []
    all_x: set[float] = set()
    for i, column in enumerate(comparison.columns):
        backends = _backends(column, sweep)
        look, width = _look(comparison, i)
        for backend in backends:
            found = sorted(
                (p for (b, _), p in column.points.items() if b == backend and p.sweep == sweep),
                key=lambda p: p.x,
            )
            found = [p for p in found if p.get(key) is not None]
            if not found:
                continue
            all_x.update(p.x for p in found)
            name = run_name(comparison, i)
            traces.append(
                trace(
                    f"{name} · {backend}" if len(backends) > 1 else name,
                    [p.x for p in found],
                    [p.get(key) for p in found],
                    look,
                    f"%{{x}}: %{{y:,.1f}} {unit}",
                    errors=[p.std.get(key, 0.0) for p in found],
                    width=width,
                    legendgroup=f"run{i}",
                )
            )
    note = ""
    if key == "output_throughput" and all_x:
        lo, hi = min(all_x), max(all_x)
        for i, column in enumerate(comparison.columns):
            base = column.results.reference
            ref = base.get(key) if base else None
            if ref:
                line = reference(
                    f"{run_name(comparison, i)} · {base.backend}",
                    lo,
                    hi,
                    ref,
                    style(i).colour,
                    f"%{{y:,.1f}} {unit}",
                )
                line["legendgroup"] = f"run{i}"
                line["showlegend"] = False  # its run's entry shows and hides it too
                traces.append(line)
                note = "dashed: each run's HF baseline (hf-sequential where it has one)"
    xs = sorted(all_x)
    fig_layout = layout(AXIS_TITLES.get(axis, axis), unit, log_x(xs, axis), xs)
    return figure(title, traces, fig_layout, note)


def _pareto(comparison: Comparison, sweep: str, axis: str) -> dict[str, Any]:
    traces = []
    short = AXIS_SHORT.get(axis, "")
    for i, column in enumerate(comparison.columns):
        found = sorted(
            (
                p
                for p in column.points.values()
                if p.sweep == sweep
                and p.get(pts.PARETO_LATENCY) is not None
                and p.get(pts.PARETO_THROUGHPUT) is not None
            ),
            key=lambda p: p.x,
        )
        if not found:
            continue
        look, width = _look(comparison, i)
        traces.append(
            trace(
                run_name(comparison, i),
                [p.get(pts.PARETO_LATENCY) for p in found],
                [p.get(pts.PARETO_THROUGHPUT) for p in found],
                look,
                "%{customdata}: %{y:,.1f} tok/s at %{x:,.0f} ms",
                width=width,
                customdata=[f"{short}={pts.number(p.x)}" for p in found],
                legendgroup=f"run{i}",
            )
        )
    fig_layout = layout("p99 TTFT (ms)", "Output tokens/s")
    fig_layout["xaxis"]["rangemode"] = "tozero"
    note = "each point a load level: up and to the left is better"
    return figure(f"Throughput against TTFT ({sweep})", traces, fig_layout, note)
