"""The run page's charts, per sweep: throughput (with the HF reference, speedups and the
capacity markers), request and token rates, throughput against latency with the Pareto
front, goodput under the SLO, latency percentiles, and the server's view (KV cache, GPU
memory, preemptions).

Input: ``portal.benchmarks.points.RunResults`` (repeats aggregated; error bars are the
standard deviation across repeats) and the run's ``capacity.CapacityPlan``. The rules
the charts draw (the Pareto front, the best point within a budget, the best goodput)
live beside the data in ``portal.benchmarks``; this module only draws them.

A chart with nothing to say is not drawn: ``RunCharts.missing`` says, per sweep, what
was not measured and why (on the CPU, vLLM reports no KV-cache usage and there is no GPU
memory; a client that recorded no p90 has no p90 line).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from portal.benchmarks import goodput
from portal.benchmarks import points as pts
from portal.benchmarks.capacity import CapacityPlan
from portal.benchmarks.points import RunResults, Series, number
from portal.web.figures.common import (
    AXIS_SHORT,
    AXIS_TITLES,
    GOOD_COLOR,
    HF_COLOR,
    NOTE_COLOR,
    SECOND_STYLE,
    STAT_STYLES,
    WARN_COLOR,
    Style,
    ax,
    by_sweep,
    chart,
    compact,
    esc,
    figure,
    layout,
    log_x,
    measured,
    reference,
    right_axis,
    spaced,
    style,
    trace,
    vline,
)
from portal.web.presenters import slo_text

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
STATS = ("p50", "p90", "p99")


@dataclass
class RunCharts:
    """The charts of a run page (``items``: ``common.chart`` entries, in page order) and,
    per sweep, what was not drawn and why (``missing``: ``{sweep, text}``)."""

    items: list[dict[str, Any]] = field(default_factory=list)
    missing: list[dict[str, str]] = field(default_factory=list)

    def add(self, sweep: str, kind: str, fig: dict[str, Any] | None) -> None:
        if fig is not None and fig["data"]:
            self.items.append(chart(f"{sweep}-{kind}", sweep, kind, fig))

    def note(self, sweep: str, text: str) -> None:
        self.missing.append({"sweep": sweep, "text": text})

    def by_sweep(self) -> list[dict[str, Any]]:
        """[{sweep, charts, missing}] in page order (``common.by_sweep``)."""
        return by_sweep(self.items, self.missing)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _mine(results: RunResults, sweep: str) -> list[Series]:
    return [s for s in results.series() if s.sweep == sweep]


def _all_x(mine: list[Series]) -> list[float]:
    return sorted({x for s in mine for x in s.xs()})


def _axis(mine: list[Series]) -> str:
    return mine[0].axis if mine else "max_concurrency"


def _xtitle(axis: str) -> str:
    return AXIS_TITLES.get(axis, axis)  # a stored axis is runner text: layout escapes it


def _stat_style(i: int, stat: str, several: bool) -> Style:
    """p50/p90/p99 each in its own colour, marker and dash; with several backends the
    backend keeps its colour and the statistic its marker and dash."""
    look = STAT_STYLES[stat]
    return Style(style(i).colour, look.symbol, look.dash) if several else look


# The reference lines of the baselines after the reference (hf-static-cache, ...).
BASELINE_COLORS = ("#7c3aed", "#0f766e", "#b45309")


def throughput_figure(
    sweep: str,
    results: RunResults,
    plan: CapacityPlan | None = None,
    metric: str = "output_throughput",
) -> dict[str, Any]:
    """Throughput against the swept axis; HF baseline as a reference line with the speedup
    over it labelled (where labels do not collide); preempting points circled in red;
    capacity markers on concurrency."""
    mine = _mine(results, sweep)
    axis = _axis(mine)
    all_x = _all_x(mine)
    logx = log_x(all_x, axis)
    unit = "req/s" if metric == "request_throughput" else "tok/s"
    traces: list[dict[str, Any]] = [
        trace(
            s.backend,
            s.xs(),
            s.ys(metric),
            style(i),
            f"%{{x}}: %{{y:,.1f}} {unit}",
            errors=s.errs(metric),
        )
        for i, s in enumerate(mine)
    ]
    annotations: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    baselines = list(results.baselines.values())  # a reference line each
    for k, b in enumerate(baselines):
        value = b.get(metric)
        if value and all_x:
            name = f"{b.backend} (baseline, {b.input_len} in / {b.output_len} out)"
            colour = HF_COLOR if k == 0 else BASELINE_COLORS[(k - 1) % len(BASELINE_COLORS)]
            traces.append(
                reference(name, all_x[0], all_x[-1], value, colour, f"%{{y:,.1f}} {unit}")
            )
    # The labels: times the reference (``results.reference_at``: the reference baseline,
    # or the chosen backend at the same point), each point where it has one.
    labelled = []
    for s in mine:
        for p in s.points:
            y, base = p.get(metric), results.reference_at(p)
            ref = base.get(metric) if base is not None else None
            if y and ref:
                labelled.append((p.x, y, y / ref))
    if labelled and all_x:
        for j in spaced([(x, y) for x, y, _ in labelled], logx, min_dx=0.07, min_dy=0.08):
            x, y, ratio = labelled[j]
            annotations.append(
                {
                    "x": ax(x, logx),
                    "y": y,
                    "text": f"{ratio:.1f}x",
                    "showarrow": False,
                    "yshift": 14,
                    "font": {"size": 11, "color": "#374151"},
                }
            )
    preempted = [
        (p.x, p.get(metric), p.get("preemptions"))
        for s in mine
        for p in s.points
        if (p.get("preemptions") or 0) > 0 and p.get(metric) is not None
    ]
    if preempted:
        traces.append(
            trace(
                "preemptions (cache past its efficient point)",
                [x for x, _, _ in preempted],
                [y for _, y, _ in preempted],
                Style(WARN_COLOR, "circle-open"),
                "%{x}: %{text}",
                mode="markers",
                size=16,
                text=[f"{n:,.0f} preemptions" for _, _, n in preempted],
            )
        )
        traces[-1]["marker"]["line"] = {"width": 2, "color": WARN_COLOR}
    if plan is not None and axis == "max_concurrency" and all_x:
        for row, (x, text, colour) in enumerate(_capacity_markers(plan, all_x)):
            shape, note = vline(x, text, colour, row=row)
            note["x"] = ax(x, logx)
            shapes.append(shape)
            annotations.append(note)
    title = THROUGHPUT_TITLES[metric]
    fig_layout = layout(_xtitle(axis), title, logx, all_x)
    fig_layout["annotations"] = annotations
    fig_layout["shapes"] = shapes
    name = results.reference_name
    where = "" if results.reference_is_baseline else " at the same point"
    note = f"the labels: times {name}{where}" if labelled and name else ""
    return figure(f"{title} ({sweep})", traces, fig_layout, note)


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
    """Requests/s (top panel) and total tokens/s (bottom panel) against the swept axis,
    sharing the x axis: at a fixed prompt and output length the two are proportional, so
    on one plot their lines would lie on top of each other."""
    mine = _mine(results, sweep)
    axis = _axis(mine)
    all_x = _all_x(mine)
    several = len(mine) > 1
    traces = []
    for i, s in enumerate(mine):
        if not (s.has("request_throughput") or s.has("total_token_throughput")):
            continue
        first = style(i) if several else STAT_STYLES["p50"]
        second = Style(style(i).colour, "diamond", "dash") if several else SECOND_STYLE
        traces.append(
            trace(
                f"{s.backend} requests/s",
                s.xs(),
                s.ys("request_throughput"),
                first,
                "%{x}: %{y:,.2f} req/s",
                errors=s.errs("request_throughput"),
            )
        )
        traces.append(
            trace(
                f"{s.backend} total tokens/s (lower panel)",
                s.xs(),
                s.ys("total_token_throughput"),
                second,
                "%{x}: %{y:,.0f} tok/s",
                errors=s.errs("total_token_throughput"),
                yaxis="y2",
            )
        )
    fig_layout = layout(_xtitle(axis), "Requests/s", log_x(all_x, axis), all_x)
    fig_layout["xaxis"]["anchor"] = "y2"
    fig_layout["yaxis"]["domain"] = [0.56, 1.0]
    fig_layout["yaxis2"] = {
        **fig_layout["yaxis"],
        "title": {"text": "Total tok/s", "standoff": 6},
        "domain": [0.0, 0.44],
    }
    note = "total = prompt + output tokens"
    return figure(f"Requests/s and total tokens/s ({sweep})", traces, fig_layout, note)


def latency_figure(sweep: str, results: RunResults, metric: str = "ttft") -> dict[str, Any]:
    """p50 / p90 / p99 of one latency metric against the swept axis, each statistic its
    own colour, marker and dash (absent statistics are left out, not drawn empty)."""
    mine = _mine(results, sweep)
    axis = _axis(mine)
    several = len(mine) > 1
    traces = []
    for i, s in enumerate(mine):
        for stat in STATS:
            key = f"{stat}_{metric}_ms"
            if not s.has(key):
                continue
            traces.append(
                trace(
                    f"{s.backend} {stat}",
                    s.xs(),
                    s.ys(key),
                    _stat_style(i, stat, several),
                    "%{x}: %{y:,.1f} ms",
                    errors=s.errs(key),
                )
            )
    all_x = _all_x(mine)
    fig_layout = layout(_xtitle(axis), "ms", log_x(all_x, axis), all_x)
    found = [stat for stat in STATS if any(s.has(f"{stat}_{metric}_ms") for s in mine)]
    note = ", ".join(found[:-1]) + (" and " if len(found) > 1 else "") + found[-1] if found else ""
    if found and "p90" not in found:
        note += " (the client recorded no p90)"
    return figure(f"{LATENCY_NAMES[metric]} ({sweep})", traces, fig_layout, note)


def pareto_figure(
    sweep: str, results: RunResults, budget_ms: float | None = None
) -> dict[str, Any] | None:
    """Output tokens/s against p99 TTFT, each point a load level, the Pareto front joined:
    read off the most throughput within a TTFT budget (drawn as a line). Load levels are
    labelled where the labels do not collide (front points first); hover names each."""
    mine = _mine(results, sweep)
    if not mine or mine[0].axis not in pts.LOAD_AXES:
        return None
    traces: list[dict[str, Any]] = []
    short = AXIS_SHORT.get(mine[0].axis, "")
    for i, s in enumerate(mine):
        found = pts.load_points(s)
        if not found:
            continue
        front = pts.pareto_front([(lat, tput) for _, lat, tput in found])
        order = front + [j for j in range(len(found)) if j not in front]
        shown = {order[k] for k in spaced([(found[j][1], found[j][2]) for j in order])}
        labels = [f"{short}={number(x)}" for x, _, _ in found]
        look = style(i)
        traces.append(
            trace(
                s.backend,
                [compact(lat) for _, lat, _ in found],
                [tput for _, _, tput in found],
                look,
                "%{customdata}: %{y:,.1f} tok/s at %{x:,.0f} ms",
                mode="markers+text",
                size=9,
                text=[labels[j] if j in shown else "" for j in range(len(found))],
                customdata=labels,
                textposition="top center",
                textfont={"size": 10, "color": "#374151"},
            )
        )
        traces.append(
            trace(
                f"{s.backend} Pareto front",
                [compact(found[j][1]) for j in front],
                [found[j][2] for j in front],
                Style(look.colour, look.symbol, "dash"),
                "",
                mode="lines",
                hoverinfo="skip",
                line={"color": look.colour, "dash": "dash", "shape": "hv", "width": 1.5},
            )
        )
    if not traces:
        return None
    fig_layout = layout("p99 time to first token (ms)", "Output tokens/s")
    if budget_ms:
        shape, note = vline(budget_ms, f"TTFT budget {budget_ms:,.0f} ms", GOOD_COLOR, "dash")
        # Top left of the line: the corner a throughput-latency curve never reaches; top
        # right when the line is near the axis (the label would leave the plot).
        widest = max((x for t in traces for x in t.get("x") or [] if isinstance(x, int | float)),
                     default=budget_ms)  # fmt: skip
        side = "left" if budget_ms < 0.3 * max(widest, budget_ms) else "right"
        note["y"], note["yanchor"], note["xanchor"] = 0.98, "top", side
        fig_layout["shapes"] = [shape]
        fig_layout["annotations"] = [note]
    fig_layout["xaxis"]["rangemode"] = "tozero"
    note = "each point a load level; the dashed line joins those no other beats on both"
    return figure(f"Throughput against TTFT ({sweep})", traces, fig_layout, note)


def goodput_figure(sweep: str, results: RunResults) -> dict[str, Any] | None:
    """Goodput (requests/s meeting the SLO) beside request throughput, the share of
    requests within the SLO on the right axis, the best point marked."""
    if not results.slo:
        return None
    mine = _mine(results, sweep)
    if not any(s.has("request_goodput") for s in mine):
        return None
    traces = []
    annotations = []
    axis = _axis(mine)
    all_x = _all_x(mine)
    logx = log_x(all_x, axis)
    several = len(mine) > 1
    for i, s in enumerate(mine):
        colour = style(i).colour if several else GOOD_COLOR
        traces.append(
            trace(
                f"{s.backend} goodput",
                s.xs(),
                s.ys("request_goodput"),
                Style(colour, "circle"),
                "%{x}: %{y:,.2f} good req/s",
                width=3,
            )
        )
        traces.append(
            trace(
                f"{s.backend} all requests/s",
                s.xs(),
                s.ys("request_throughput"),
                Style(style(i).colour if several else "#2563eb", "square", "dot"),
                "%{x}: %{y:,.2f} req/s",
                width=1.5,
                size=6,
            )
        )
        attainment = [v * 100 if v is not None else None for v in s.ys("slo_attainment")]
        traces.append(
            trace(
                f"{s.backend} % within SLO (right axis)",
                s.xs(),
                attainment,
                Style(NOTE_COLOR, "triangle-up", "dash"),
                "%{x}: %{y:.0f}% within SLO",
                yaxis="y2",
                width=1.5,
            )
        )
        best = goodput.best_point(s.points)
        if best is not None:
            annotations.append(
                {
                    "x": ax(best.x, logx),
                    "y": best.get("request_goodput"),
                    "text": esc(f"best: {number(best.x)}"),
                    "arrowcolor": GOOD_COLOR,
                    "ax": 0,
                    "ay": -35,
                    "font": {"color": GOOD_COLOR, "size": 11},
                }
            )
    fig_layout = layout(_xtitle(axis), "Requests/s", logx, all_x)
    fig_layout["yaxis2"] = right_axis(
        "% of requests within SLO", range=[0, 105], rangemode="normal"
    )
    fig_layout["annotations"] = annotations
    fig_layout["margin"]["r"] = 60
    title = f"Goodput under the SLO ({sweep})"
    return figure(title, traces, fig_layout, slo_text(results.slo))


CPU_REASON = (
    "this run used the CPU: vLLM's CPU backend reports no KV-cache usage and there is no "
    "GPU memory to read"
)


def server_figure(
    sweep: str,
    results: RunResults,
    gpu_memory_bytes: float | None = None,
    on_cpu: bool = False,
) -> tuple[dict[str, Any] | None, list[str]]:
    """Per point: peak KV-cache usage and peak GPU memory (% of the GPU's), left axis;
    preemptions (when there were any) in red on the right axis. A line that would be all
    zeros or empty is left out, and the notes say what was not measured and why."""
    mine = _mine(results, sweep)
    traces: list[dict[str, Any]] = []
    kv_seen = gpu_seen = preempted = False
    for i, s in enumerate(mine):
        look = style(i)
        kv = [v * 100 if v is not None else None for v in s.ys("kv_cache_usage_peak")]
        if measured(kv):
            kv_seen = True
            traces.append(
                trace(
                    f"{s.backend} peak KV cache %",
                    s.xs(),
                    kv,
                    look,
                    "%{x}: %{y:.0f}% of the KV cache",
                )
            )
        memory = s.ys("gpu_memory_peak_bytes")
        if measured(memory) and gpu_memory_bytes:
            gpu_seen = True
            traces.append(
                trace(
                    f"{s.backend} peak GPU memory %",
                    s.xs(),
                    [v / gpu_memory_bytes * 100 if v is not None else None for v in memory],
                    Style("#7c3aed" if len(mine) == 1 else look.colour, "square", "dash"),
                    "%{x}: %{y:.0f}% of GPU memory",
                )
            )
        if measured(s.ys("preemptions")):
            preempted = True
            traces.append(
                trace(
                    f"{s.backend} preemptions (right axis)",
                    s.xs(),
                    s.ys("preemptions"),
                    Style(WARN_COLOR, "x"),
                    "%{x}: %{y:,.0f} preemptions",
                    yaxis="y2",
                    width=1.5,
                    size=9,
                )
            )
    notes = []
    if not kv_seen and not gpu_seen:
        why = CPU_REASON if on_cpu else "the server reported nothing, or 0, at every point"
        notes.append(f"KV cache and GPU memory: not measured ({why}).")
    elif not kv_seen:
        notes.append("Peak KV-cache usage: the server reported nothing, or 0%, at every point.")
    elif not gpu_seen:
        why = (
            "there is no GPU memory on the CPU"
            if on_cpu
            else "the runner read no GPU memory, or the GPU's total is unknown"
        )
        notes.append(f"Peak GPU memory: not measured ({why}).")
    if not traces:
        return None, notes
    title = "KV cache and GPU memory" + (", preemptions" if preempted else "")
    note = "" if preempted else "no preemptions"
    all_x = _all_x(mine)
    fig_layout = layout(
        _xtitle(_axis(mine)), "% (peak during the point)", log_x(all_x, _axis(mine)), all_x
    )
    fig_layout["yaxis"]["range"] = [0, 105]
    fig_layout["yaxis"]["rangemode"] = "normal"
    if preempted:
        fig_layout["yaxis2"] = right_axis("Preemptions")
        fig_layout["margin"]["r"] = 60
    return figure(f"{title} ({sweep})", traces, fig_layout, note), notes


def run_figures(
    results: RunResults,
    plan: CapacityPlan | None = None,
    gpu_memory_bytes: float | None = None,
    budget_ms: float | None = None,
    on_cpu: bool = False,
) -> RunCharts:
    """Every chart of a run page, grouped by sweep, and what was not drawn and why."""
    out = RunCharts()
    for sweep in results.sweeps():
        mine = _mine(results, sweep)
        if all(len(s.points) < 2 for s in mine):
            # One point per backend (a spec without sweeps measures the workload's own
            # point): a line through one dot says nothing, eight times over. Its numbers
            # are in the summary table; against the baselines, one bar chart.
            if results.baselines:
                out.add(sweep, "output", throughput_figure(sweep, results, plan))
            out.note(
                sweep,
                "One point per backend here, so no curves: its numbers are in the summary "
                "table below.",
            )
            continue
        out.add(sweep, "output", throughput_figure(sweep, results, plan))
        out.add(sweep, "rates", rates_figure(sweep, results))
        if mine and mine[0].axis in pts.LOAD_AXES:
            fig = pareto_figure(sweep, results, budget_ms)
            if fig is None:
                out.note(sweep, "Throughput against TTFT: no point measured a p99 TTFT.")
            out.add(sweep, "pareto", fig)
        if results.slo:
            fig = goodput_figure(sweep, results)
            if fig is None:
                out.note(
                    sweep,
                    "Goodput: the spec sets an SLO, but no point has the per-request "
                    "samples to count the requests that met it.",
                )
            out.add(sweep, "goodput", fig)
        absent = []
        for metric in ("ttft", "tpot", "itl", "e2el"):
            fig = latency_figure(sweep, results, metric)
            if not fig["data"]:
                absent.append(LATENCY_NAMES[metric].lower())
            out.add(sweep, metric, fig)
        if absent:
            out.note(sweep, f"Not in the bench client's output here: {', '.join(absent)}.")
        fig, notes = server_figure(sweep, results, gpu_memory_bytes, on_cpu)
        out.add(sweep, "server", fig)
        for text in notes:
            out.note(sweep, text)
    return out
