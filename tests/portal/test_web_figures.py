"""The figure builders: series per sweep, repeats averaged, HF as reference, Pareto front,
capacity markers, distinct styles, no empty charts (and why), and user text escaped for
plotly; the rules they draw (Pareto front, best within a budget, the default budget)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from portal.benchmarks import points as pts
from portal.benchmarks.capacity import CacheSize, CapacityPlan
from portal.web import figures, tables
from portal.web.figures.common import TRACE_TYPES, spaced


def m(backend, kind, sweep, axis, value, repeat, out, p99_ttft=100.0, status="succeeded", **cols):
    """A Measurement-shaped object (the aggregation reads attributes)."""
    key = f"{sweep}:{axis}={value}" if axis else sweep
    return SimpleNamespace(
        pk=id(object()),
        backend=backend,
        backend_kind=kind,
        point_key=key,
        sweep=sweep,
        axis=axis or "",
        value=value,
        repeat=repeat,
        status=status,
        error="" if status == "succeeded" else "server crashed",
        input_len=128,
        output_len=32,
        concurrency=int(value) if axis == "max_concurrency" else 1,
        num_prompts=32,
        metrics={
            "output_throughput": out,
            "median_ttft_ms": p99_ttft / 2,
            "p90_ttft_ms": p99_ttft * 0.9,
            "p99_ttft_ms": p99_ttft,
        }
        if status == "succeeded"
        else {},
        preemptions=cols.get("preemptions"),
        kv_cache_usage_peak=cols.get("kv"),
        gpu_memory_peak_bytes=None,
        prefix_cache_hit_rate=None,
        server_metrics={},
        conditions={},
        raw={},
    )


@pytest.fixture
def results() -> pts.RunResults:
    rows: list[Any] = [
        m("hf-sequential", "hf-sequential", "baseline", None, None, 0, 50.0),
        m("hf-sequential", "hf-sequential", "baseline", None, None, 1, 70.0),
        m("vllm", "vllm", "concurrency", "max_concurrency", 16, 0, 900.0, 300.0, preemptions=5),
        m("vllm", "vllm", "concurrency", "max_concurrency", 1, 0, 100.0, 50.0),
        m("vllm", "vllm", "concurrency", "max_concurrency", 1, 1, 140.0, 50.0),
        m("vllm", "vllm", "concurrency", "max_concurrency", 4, 0, 400.0, 400.0),
        m("vllm", "vllm", "concurrency", "max_concurrency", 64, 0, 0.0, status="failed"),
        m("vllm", "vllm", "prompt-length", "input_len", 128, 0, 300.0),
    ]
    return pts.RunResults(pts.aggregate(rows))


def test_it_groups_by_sweep_sorts_points_and_averages_repeats(results):
    series = results.series()
    assert [(s.sweep, s.backend) for s in series] == [
        ("concurrency", "vllm"),
        ("prompt-length", "vllm"),
    ]
    conc = series[0]
    assert conc.xs() == [1.0, 4.0, 16.0]  # the failed point at 64 is not drawn as zero
    assert conc.ys("output_throughput") == [120.0, 400.0, 900.0]
    assert conc.errs("output_throughput")[0] == pytest.approx(28.284, abs=1e-3)
    assert conc.ys("p50_ttft_ms") == [25.0, 200.0, 150.0]  # vLLM's median stands in for p50
    assert results.baselines["hf-sequential"].get("output_throughput") == 60.0
    failed = next(p for p in results.points if p.point_key.endswith("=64"))
    assert failed.failed == 1 and failed.errors == ["server crashed"] and not failed.ok


def test_throughput_chart_has_the_baseline_line_speedups_and_preemptions(results):
    fig = figures.throughput_figure("concurrency", results)
    names = [t["name"] for t in fig["data"]]
    assert names == [
        "vllm",
        "hf-sequential (baseline, 128 in / 32 out)",
        "preemptions (cache past its efficient point)",
    ]
    baseline = fig["data"][1]
    assert baseline["y"] == [60.0, 60.0]
    assert baseline["x"] == [1.0, 16.0]
    assert fig["data"][2]["x"] == [16.0]
    labels = [a["text"] for a in fig["layout"]["annotations"]]
    assert labels == ["2.0x", "6.7x", "15.0x"]
    assert fig["title"] == "Output tokens/s (concurrency)"
    assert fig["layout"]["title"]["text"].startswith("Output tokens/s (concurrency)")
    assert fig["layout"]["xaxis"]["type"] == "log"  # 1..16 spans a 16x range
    # On a log axis plotly wants annotations at log10(x).
    assert [a["x"] for a in fig["layout"]["annotations"]] == pytest.approx(
        [0.0, 0.602, 1.204], abs=1e-3
    )


def test_capacity_markers_go_on_the_concurrency_chart(results):
    plan = CapacityPlan(
        flattened_at=16.0, preemptions_from=16.0, cache_limited_concurrency=40,
        cache=CacheSize(10**9, "estimate", estimated=True),
    )  # fmt: skip
    fig = figures.throughput_figure("concurrency", results, plan)
    marks = [a["text"] for a in fig["layout"]["annotations"] if "x" not in a["text"][-1:]]
    assert marks == ["flattened at 16", "preemptions from 16", "KV cache fits est. 40"]
    assert len(fig["layout"]["shapes"]) == 3


def test_latency_chart_draws_the_percentiles_it_has(results):
    fig = figures.latency_figure("concurrency", results, "ttft")
    assert [t["name"] for t in fig["data"]] == ["vllm p50", "vllm p90", "vllm p99"]
    assert fig["data"][2]["y"] == [50.0, 400.0, 300.0]
    assert figures.latency_figure("concurrency", results, "e2el")["data"] == []


def test_lines_of_one_chart_differ_in_colour_marker_and_dash(results):
    for fig in (
        figures.latency_figure("concurrency", results, "ttft"),
        figures.rates_figure("concurrency", _rates(results)),
    ):
        looks = [
            (t["line"]["color"], t["marker"]["symbol"], t["line"]["dash"]) for t in fig["data"]
        ]
        assert len(looks) >= 2
        for part in range(3):  # no two lines share a colour, a marker or a dash
            assert len({look[part] for look in looks}) == len(looks), looks
        assert fig["layout"]["showlegend"] is True


def _rates(results: pts.RunResults) -> pts.RunResults:
    for p in results.points:
        if p.ok:
            p.mean["request_throughput"] = (p.get("output_throughput") or 0) / 32
            p.mean["total_token_throughput"] = (p.get("output_throughput") or 0) * 5
    return results


def test_the_pareto_front_keeps_only_undominated_points(results):
    # (latency, throughput): the point at 400 ms / 400 tok/s is beaten by 300 ms / 900.
    assert pts.pareto_front([(50, 120), (400, 400), (300, 900)]) == [0, 2]
    fig = figures.pareto_figure("concurrency", results, budget_ms=350)
    points, front = fig["data"]
    assert points["customdata"] == ["c=1", "c=4", "c=16"]
    assert points["text"] == ["c=1", "c=4", "c=16"]  # far apart: every one labelled
    assert front["x"] == [50.0, 300.0] and front["y"] == [120.0, 900.0]
    assert fig["layout"]["shapes"][0]["x0"] == 350
    # The budget's label sits left of its line, in the corner no curve reaches; beside
    # the axis (points out to 400 ms, budget 20 ms) it goes right, or it leaves the plot.
    assert fig["layout"]["annotations"][0]["xanchor"] == "right"
    near_axis = figures.pareto_figure("concurrency", results, budget_ms=20)
    assert near_axis["layout"]["annotations"][0]["xanchor"] == "left"
    assert figures.pareto_figure("prompt-length", results) is None  # not a load sweep


def test_labels_that_would_overlap_are_left_to_the_hover():
    # Four load levels bunched at the low end, one far away: the bunch gets one label.
    bunch = [(10.0, 100.0), (10.5, 101.0), (11.0, 102.0), (11.5, 103.0), (300.0, 900.0)]
    assert spaced(bunch) == [0, 4]
    rows = [
        m("vllm", "vllm", "concurrency", "max_concurrency", c, 0, out, lat)
        for c, (lat, out) in zip((1, 2, 3, 4, 64), bunch, strict=True)
    ]
    fig = figures.pareto_figure("concurrency", pts.RunResults(pts.aggregate(rows)))
    texts = fig["data"][0]["text"]
    assert [t for t in texts if t] == ["c=1", "c=64"]
    assert fig["data"][0]["customdata"] == ["c=1", "c=2", "c=3", "c=4", "c=64"]  # hover


def test_best_within_budget_and_the_default_budget(results):
    conc = results.series()[0]
    found = pts.load_points(conc)
    assert found == [(1.0, 50.0, 120.0), (4.0, 400.0, 400.0), (16.0, 300.0, 900.0)]
    assert pts.best_within_budget(found, 350) == (16.0, 300.0, 900.0)
    assert pts.best_within_budget(found, 10) is None
    # No SLO: the median p99 TTFT of the load points (50, 300, 400), two digits.
    assert pts.default_ttft_budget(results) == (
        300.0,
        "the median p99 TTFT of the measured load points",
    )
    results.slo = {"ttft_ms": 250.0}
    assert pts.default_ttft_budget(results) == (250.0, "the spec's SLO")


def test_run_figures_lists_the_charts_of_each_sweep(results):
    charts = figures.run_figures(results)
    assert [f["id"] for f in charts.items] == [
        "concurrency-output", "concurrency-pareto", "concurrency-ttft", "concurrency-server",
        "prompt-length-output",
    ]  # fmt: skip
    # One point per backend in prompt-length: no curves through one dot; the bars against
    # the baselines stay, and the page says where its numbers are.
    first = charts.items[0]
    assert first["title"] == "Output tokens/s (concurrency)" and set(first["figure"]) == {
        "data",
        "layout",
    }
    groups = charts.by_sweep()
    assert [g["sweep"] for g in groups] == ["concurrency", "prompt-length"]
    assert "time per output token" in " ".join(groups[0]["missing"])
    assert "One point per backend here, so no curves" in " ".join(groups[1]["missing"])


def test_a_single_point_without_baselines_draws_no_chart():
    rows = [m("prod", "endpoint", "single", "", 0, 0, 10.0)]
    charts = figures.run_figures(pts.RunResults(pts.aggregate(rows)))
    assert charts.items == []
    assert "in the summary table" in charts.by_sweep()[0]["missing"][0]


def test_a_chart_of_zeros_is_not_drawn_and_the_page_says_why():
    rows = [
        m("vllm", "vllm", "c", "max_concurrency", c, 0, 100.0 * c, preemptions=0.0, kv=0.0)
        for c in (1, 4, 16)
    ]
    results = pts.RunResults(pts.aggregate(rows))
    fig, notes = figures.server_figure("c", results, gpu_memory_bytes=None, on_cpu=True)
    assert fig is None
    assert notes == [
        "KV cache and GPU memory: not measured (this run used the CPU: vLLM's CPU backend "
        "reports no KV-cache usage and there is no GPU memory to read)."
    ]
    charts = figures.run_figures(results, on_cpu=True)
    assert "c-server" not in [f["id"] for f in charts.items]
    assert notes[0] in charts.by_sweep()[0]["missing"]
    # On a GPU with a KV-cache reading, the chart is drawn without the empty lines.
    rows[2].kv_cache_usage_peak = 0.5
    fig, notes = figures.server_figure("c", pts.RunResults(pts.aggregate(rows)), None)
    assert [t["name"] for t in fig["data"]] == ["vllm peak KV cache %"]
    assert notes == [
        "Peak GPU memory: not measured (the runner read no GPU memory, or the GPU's total "
        "is unknown)."
    ]


def test_every_trace_type_is_in_the_bundle(results):
    """The page loads plotly.js's basic bundle: every trace must be of a type it has."""
    charts = figures.run_figures(results, budget_ms=300)
    types = {t["type"] for f in charts.items for t in f["figure"]["data"]}
    assert types and types <= set(TRACE_TYPES) <= {"scatter", "bar", "pie"}


def test_a_run_with_only_failures_has_no_charts():
    failed = [m("vllm", "vllm", "c", "max_concurrency", 1, 0, 0.0, status="failed")]
    assert figures.run_figures(pts.RunResults(pts.aggregate(failed))).items == []


def test_headers_name_their_unit_once(results):
    headings = {h.key: (h.label, h.unit) for h in tables.summary_headings(results)}
    assert headings["output_throughput"] == ("Output tok/s", "")
    assert headings["p99_ttft_ms"] == ("TTFT p99", "ms")
    for label, unit in headings.values():
        assert not unit or unit not in label, (label, unit)


def test_the_summary_shows_key_columns_first_and_the_rest_on_demand(results):
    headings = tables.summary_headings(results)
    shown = [h.key for h in headings if not h.extra]
    assert shown[:1] == ["output_throughput"]
    assert "p99_ttft_ms" in shown and "p90_ttft_ms" not in shown
    assert "preemptions" in shown  # a point preempted: it is a key column here
    first_extra = next(i for i, h in enumerate(headings) if h.extra)
    assert all(h.extra for h in headings[first_extra:])  # key columns come first


def test_user_strings_are_escaped_for_plotly():
    assert figures.esc('<a href="javascript:x">x</a>') == '&lt;a href="javascript:x"&gt;x&lt;/a&gt;'
    rows = [m("<b>x</b>", "vllm", "<i>s</i>", "max_concurrency", c, 0, 10.0) for c in (1, 2)]
    charts = figures.run_figures(pts.RunResults(pts.aggregate(rows)))
    fig = charts.items[0]
    assert fig["title"] == "Output tokens/s (<i>s</i>)"  # plain text: the page escapes it
    assert "<i>" not in fig["figure"]["layout"]["title"]["text"]
    assert all("<b>" not in t["name"] for c in charts.items for t in c["figure"]["data"])
