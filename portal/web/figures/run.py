"""The run page's charts, per sweep: throughput (with the HF reference, speedups and the
capacity markers), request and token rates, latency percentiles, throughput against
latency with the Pareto front, goodput under the SLO, and the server's view (KV cache,
GPU memory, preemptions).

Input: ``portal.benchmarks.points.RunResults`` (repeats aggregated; error bars are the
standard deviation across repeats) and the run's ``capacity.CapacityPlan``.
"""

from __future__ import annotations

import math
from typing import Any

from portal.benchmarks import goodput
from portal.benchmarks.capacity import CapacityPlan
from portal.benchmarks.points import RunResults, Series, number
from portal.web.figures.common import (
    AXIS_SHORT,
    AXIS_TITLES,
    GOOD_COLOR,
    HF_COLOR,
    NOTE_COLOR,
    WARN_COLOR,
    color,
    compact,
    compact_list,
    esc,
    layout,
    log_x,
    right_axis,
    vline,
)

LATENCY_NAMES = {
    "ttft": "Time to first token",
    "tpot": "Time per output token",
    "itl": "Inter-token latency",
    "e2el": "End-to-end latency",
}
THROUGHPUT_TITLES = {
    "output_throughput": "Output tokens/s",
    "total_token_throughput": "Total tokens/s",
    "request_throughput": "Requests/s",
}
LOAD_AXES = ("max_concurrency", "request_rate")  # axes where "each point is a load level"


def _ax(x: float, logx: bool) -> float:
    """An annotation's x: plotly wants log10(x) on a log axis."""
    return math.log10(x) if logx and x > 0 else x


def _mine(series: list[Series], sweep: str) -> list[Series]:
    return [s for s in series if s.sweep == sweep]


def _all_x(mine: list[Series]) -> list[float]:
    return sorted({x for s in mine for x in s.xs()})


def throughput_figure(
    sweep: str,
    results: RunResults,
    plan: CapacityPlan | None = None,
    metric: str = "output_throughput",
) -> dict[str, Any]:
    """Throughput against the swept axis; HF baseline as a reference line with the speedup
    over it labelled; preempting points circled in red; capacity markers on concurrency."""
    series = results.series()
    mine = _mine(series, sweep)
    axis = mine[0].axis if mine else "max_concurrency"
    all_x = _all_x(mine)
    logx = log_x(all_x, axis)
    traces: list[dict[str, Any]] = []
    for i, s in enumerate(mine):
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": esc(s.backend),
                "x": s.xs(),
                "y": compact_list(s.ys(metric)),
                "error_y": {"type": "data", "array": compact_list(s.errs(metric)), "visible": True},
                "line": {"color": color(i)},
                "hovertemplate": "%{x}: %{y:,.1f} tok/s",
            }
        )
    annotations: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    for name, base in results.baselines.items():
        ref = base.get(metric)
        if not ref or not all_x:
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": esc(f"{name} (baseline, {base.input_len} in / {base.output_len} out)"),
                "x": [all_x[0], all_x[-1]],
                "y": [compact(ref), compact(ref)],
                "line": {"color": HF_COLOR, "dash": "dash"},
                "hovertemplate": "%{y:,.1f} tok/s",
            }
        )
        for s in mine:
            for x, y in zip(s.xs(), s.ys(metric), strict=True):
                if y:
                    annotations.append(
                        {
                            "x": _ax(x, logx),
                            "y": y,
                            "text": f"{y / ref:.1f}x",
                            "showarrow": False,
                            "yshift": 14,
                            "font": {"size": 11, "color": "#374151"},
                        }
                    )
        break  # one reference line: the first baseline
    preempted = [
        (p.x, p.get(metric), p.get("preemptions"))
        for s in mine
        for p in s.points
        if (p.get("preemptions") or 0) > 0 and p.get(metric) is not None
    ]
    if preempted:
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "preemptions (cache past its efficient point)",
                "x": [x for x, _, _ in preempted],
                "y": [compact(y) for _, y, _ in preempted],
                "text": [f"{n:,.0f} preemptions" for _, _, n in preempted],
                "marker": {
                    "symbol": "circle-open",
                    "size": 16,
                    "color": WARN_COLOR,
                    "line": {"width": 2},
                },
                "hovertemplate": "%{x}: %{text}",
            }
        )
    if plan is not None and axis == "max_concurrency" and all_x:
        for row, (x, text, colour) in enumerate(_capacity_markers(plan, all_x)):
            shape, note = vline(x, text, colour, row=row)
            note["x"] = _ax(x, logx)
            shapes.append(shape)
            annotations.append(note)
    title = THROUGHPUT_TITLES[metric]
    xtitle = esc(AXIS_TITLES.get(axis, axis))  # a stored axis is runner text: escaped
    fig_layout = layout(f"{title} ({esc(sweep)})", xtitle, title, logx, all_x)
    fig_layout["annotations"] = annotations
    fig_layout["shapes"] = shapes
    return {"data": traces, "layout": fig_layout}


def _capacity_markers(plan: CapacityPlan, all_x: list[float]) -> list[tuple[float, str, str]]:
    """(x, label, colour) for where throughput flattened, preemptions began and the KV
    cache stops fitting more requests (when that lies near the measured range)."""
    out = []
    if plan.flattened_at is not None:
        out.append((plan.flattened_at, f"flattened at {number(plan.flattened_at)}", NOTE_COLOR))
    if plan.preemptions_from is not None:
        out.append(
            (plan.preemptions_from, f"preemptions from {number(plan.preemptions_from)}", WARN_COLOR)
        )
    limit = plan.cache_limited_concurrency
    if limit is not None and limit >= 1 and limit <= all_x[-1] * 4:
        est = "est. " if plan.cache and plan.cache.estimated else ""
        out.append((float(limit), f"KV cache fits {est}{limit:,}", GOOD_COLOR))
    return out


def rates_figure(sweep: str, results: RunResults) -> dict[str, Any]:
    """Requests/s (left axis) and total tokens/s (right axis) against the swept axis."""
    mine = _mine(results.series(), sweep)
    axis = mine[0].axis if mine else "max_concurrency"
    all_x = _all_x(mine)
    traces = []
    for i, s in enumerate(mine):
        if not (s.has("request_throughput") or s.has("total_token_throughput")):
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": esc(f"{s.backend} requests/s"),
                "x": s.xs(),
                "y": compact_list(s.ys("request_throughput")),
                "error_y": {
                    "type": "data",
                    "array": compact_list(s.errs("request_throughput")),
                    "visible": True,
                },
                "line": {"color": color(i)},
                "hovertemplate": "%{x}: %{y:,.2f} req/s",
            }
        )
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": esc(f"{s.backend} total tokens/s"),
                "x": s.xs(),
                "y": compact_list(s.ys("total_token_throughput")),
                "yaxis": "y2",
                "line": {"color": color(i), "dash": "dash"},
                "marker": {"symbol": "diamond"},
                "hovertemplate": "%{x}: %{y:,.0f} tok/s",
            }
        )
    fig_layout = layout(
        f"Requests/s and total tokens/s ({esc(sweep)})",
        esc(AXIS_TITLES.get(axis, axis)),
        "Requests/s",
        log_x(all_x, axis),
        all_x,
    )
    fig_layout["yaxis2"] = right_axis("Total tokens/s (prompt + output)")
    fig_layout["margin"]["r"] = 70
    return {"data": traces, "layout": fig_layout}


def latency_figure(sweep: str, results: RunResults, metric: str = "ttft") -> dict[str, Any]:
    """p50 / p90 / p99 of one latency metric against the swept axis (absent stats are
    left out rather than drawn empty)."""
    mine = _mine(results.series(), sweep)
    axis = mine[0].axis if mine else "max_concurrency"
    traces = []
    dashes = {"p50": "solid", "p90": "dash", "p99": "dot"}
    for i, s in enumerate(mine):
        for stat, dash in dashes.items():
            key = f"{stat}_{metric}_ms"
            if not s.has(key):
                continue
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": esc(f"{s.backend} {stat}"),
                    "x": s.xs(),
                    "y": compact_list(s.ys(key)),
                    "line": {"color": color(i), "dash": dash},
                    "hovertemplate": "%{x}: %{y:,.1f} ms",
                }
            )
    all_x = _all_x(mine)
    return {
        "data": traces,
        "layout": layout(
            f"{LATENCY_NAMES[metric]} ({esc(sweep)})",
            esc(AXIS_TITLES.get(axis, axis)),
            "ms",
            log_x(all_x, axis),
            all_x,
        ),
    }


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both latency (lower) and throughput
    (higher), sorted by latency. ``points``: (latency, throughput)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front: list[int] = []
    best = -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def best_within_budget(
    points: list[tuple[float, float, float]], budget_ms: float
) -> tuple[float, float, float] | None:
    """(x, latency, throughput) with the highest throughput whose latency <= budget."""
    ok = [p for p in points if p[1] <= budget_ms]
    return max(ok, key=lambda p: p[2], default=None)


PARETO_LATENCY = "p99_ttft_ms"


def pareto_figure(
    sweep: str, results: RunResults, budget_ms: float | None = None
) -> dict[str, Any] | None:
    """Output tokens/s against p99 TTFT, each point a load level, the Pareto front joined:
    read off the most throughput within a TTFT budget."""
    mine = _mine(results.series(), sweep)
    if not mine or mine[0].axis not in LOAD_AXES:
        return None
    traces: list[dict[str, Any]] = []
    short = AXIS_SHORT.get(mine[0].axis, "")
    for i, s in enumerate(mine):
        pts = [
            (p.x, p.get(PARETO_LATENCY), p.get("output_throughput"))
            for p in s.points
            if p.get(PARETO_LATENCY) is not None and p.get("output_throughput") is not None
        ]
        if not pts:
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "markers+text",
                "name": esc(s.backend),
                "x": [compact(lat) for _, lat, _ in pts],
                "y": [compact(tput) for _, _, tput in pts],
                "text": [f"{short}={number(x)}" for x, _, _ in pts],
                "customdata": [x for x, _, _ in pts],
                "textposition": "top center",
                "marker": {"color": color(i), "size": 9},
                "hovertemplate": f"{short}=%{{customdata}}: %{{y:,.1f}} tok/s at %{{x:,.0f}} ms",
            }
        )
        front = pareto_front([(lat, tput) for _, lat, tput in pts])
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": esc(f"{s.backend} Pareto front"),
                "x": [compact(pts[j][1]) for j in front],
                "y": [compact(pts[j][2]) for j in front],
                "line": {"color": color(i), "dash": "dash", "shape": "hv"},
                "hoverinfo": "skip",
            }
        )
    if not traces:
        return None
    fig_layout = layout(
        f"Throughput against TTFT ({esc(sweep)})", "p99 time to first token (ms)", "Output tokens/s"
    )
    if budget_ms:
        shape, note = vline(budget_ms, f"TTFT budget {budget_ms:,.0f} ms", GOOD_COLOR, "dash")
        fig_layout["shapes"] = [shape]
        fig_layout["annotations"] = [note]
    fig_layout["xaxis"]["rangemode"] = "tozero"
    return {"data": traces, "layout": fig_layout}


def goodput_figure(sweep: str, results: RunResults) -> dict[str, Any] | None:
    """Goodput (requests/s meeting the SLO) beside request throughput, the share of
    requests within the SLO on the right axis, the best point marked."""
    if not results.slo:
        return None
    mine = _mine(results.series(), sweep)
    if not any(s.has("request_goodput") for s in mine):
        return None
    traces = []
    annotations = []
    axis = mine[0].axis
    all_x = _all_x(mine)
    logx = log_x(all_x, axis)
    for i, s in enumerate(mine):
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": esc(f"{s.backend} goodput"),
                "x": s.xs(),
                "y": compact_list(s.ys("request_goodput")),
                "line": {"color": color(i), "width": 3},
                "hovertemplate": "%{x}: %{y:,.2f} good req/s",
            }
        )
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": esc(f"{s.backend} all requests/s"),
                "x": s.xs(),
                "y": compact_list(s.ys("request_throughput")),
                "line": {"color": color(i), "dash": "dot", "width": 1.5},
                "hovertemplate": "%{x}: %{y:,.2f} req/s",
            }
        )
        attainment = [v * 100 if v is not None else None for v in s.ys("slo_attainment")]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": esc(f"{s.backend} % within SLO"),
                "x": s.xs(),
                "y": compact_list(attainment),
                "yaxis": "y2",
                "line": {"color": GOOD_COLOR, "dash": "dash", "width": 1.5},
                "marker": {"symbol": "triangle-up", "size": 7},
                "hovertemplate": "%{x}: %{y:.0f}% within SLO",
            }
        )
        best = goodput.best_point(s.points)
        if best is not None:
            annotations.append(
                {
                    "x": _ax(best.x, logx),
                    "y": best.get("request_goodput"),
                    "text": f"best: {number(best.x)}",
                    "arrowcolor": GOOD_COLOR,
                    "ax": 0,
                    "ay": -35,
                    "font": {"color": GOOD_COLOR, "size": 11},
                }
            )
    fig_layout = layout(
        f"Goodput under the SLO ({slo_text(results.slo)})",
        esc(AXIS_TITLES.get(axis, axis)),
        "Requests/s",
        logx,
        all_x,
    )
    fig_layout["yaxis2"] = right_axis(
        "% of requests within SLO", range=[0, 105], rangemode="normal"
    )
    fig_layout["annotations"] = annotations
    fig_layout["margin"]["r"] = 70
    return {"data": traces, "layout": fig_layout}


def slo_text(slo: dict[str, float]) -> str:
    """{'ttft_ms': 600} -> 'TTFT ≤ 600 ms'."""
    return ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.items())


def server_figure(
    sweep: str, results: RunResults, gpu_memory_bytes: float | None = None
) -> dict[str, Any] | None:
    """Per point: peak KV-cache usage and peak GPU memory (% of the GPU's), left axis;
    preemptions (when there were any) in red on the right axis."""
    mine = _mine(results.series(), sweep)
    keys = ("kv_cache_usage_peak", "gpu_memory_peak_bytes", "preemptions")
    if not any(s.has(k) for s in mine for k in keys):
        return None
    axis = mine[0].axis
    all_x = _all_x(mine)
    traces: list[dict[str, Any]] = []
    preempted = False
    for i, s in enumerate(mine):
        if s.has("kv_cache_usage_peak"):
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": esc(f"{s.backend} peak KV cache %"),
                    "x": s.xs(),
                    "y": [compact(v * 100) if v is not None else None for v in s.ys(keys[0])],
                    "line": {"color": color(i)},
                    "hovertemplate": "%{x}: %{y:.0f}% of the KV cache",
                }
            )
        if s.has("gpu_memory_peak_bytes") and gpu_memory_bytes:
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": esc(f"{s.backend} peak GPU memory %"),
                    "x": s.xs(),
                    "y": [
                        compact(v / gpu_memory_bytes * 100) if v is not None else None
                        for v in s.ys(keys[1])
                    ],
                    "line": {"color": color(i), "dash": "dash"},
                    "marker": {"symbol": "square"},
                    "hovertemplate": "%{x}: %{y:.0f}% of GPU memory",
                }
            )
        if any((v or 0) > 0 for v in s.ys("preemptions")):
            preempted = True
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": esc(f"{s.backend} preemptions"),
                    "x": s.xs(),
                    "y": compact_list(s.ys("preemptions")),
                    "yaxis": "y2",
                    "line": {"color": WARN_COLOR, "width": 1.5},
                    "marker": {"symbol": "x", "size": 9, "color": WARN_COLOR},
                    "hovertemplate": "%{x}: %{y:,.0f} preemptions",
                }
            )
    if not traces:
        return None
    note = "" if preempted else ", no preemptions"
    fig_layout = layout(
        f"KV cache, GPU memory{note if note else ' and preemptions'} ({esc(sweep)})",
        esc(AXIS_TITLES.get(axis, axis)),
        "% (peak during the point)",
        log_x(all_x, axis),
        all_x,
    )
    fig_layout["yaxis"]["range"] = [0, 105]
    if preempted:
        fig_layout["yaxis2"] = right_axis("Preemptions")
        fig_layout["margin"]["r"] = 70
    return {"data": traces, "layout": fig_layout}


def run_figures(
    results: RunResults,
    plan: CapacityPlan | None = None,
    gpu_memory_bytes: float | None = None,
    budget_ms: float | None = None,
) -> list[dict[str, Any]]:
    """Every chart of a run page, grouped by sweep: [{id, sweep, kind, figure}]."""
    out: list[dict[str, Any]] = []

    def add(sweep: str, kind: str, figure: dict[str, Any] | None) -> None:
        if figure is not None and figure["data"]:
            out.append({"id": f"{sweep}-{kind}", "sweep": sweep, "kind": kind, "figure": figure})

    for sweep in results.sweeps():
        add(sweep, "output", throughput_figure(sweep, results, plan))
        add(sweep, "rates", rates_figure(sweep, results))
        add(sweep, "pareto", pareto_figure(sweep, results, budget_ms))
        add(sweep, "goodput", goodput_figure(sweep, results))
        for metric in ("ttft", "tpot", "itl", "e2el"):
            add(sweep, metric, latency_figure(sweep, results, metric))
        add(sweep, "server", server_figure(sweep, results, gpu_memory_bytes))
    return out
