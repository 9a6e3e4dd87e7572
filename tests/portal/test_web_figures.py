"""The figure builders: series per sweep, repeats averaged, HF as reference, Pareto front,
capacity markers, and user text escaped for plotly."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from portal.benchmarks import points as pts
from portal.benchmarks.capacity import CacheSize, CapacityPlan
from portal.web import figures


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


def test_the_pareto_front_keeps_only_undominated_points(results):
    # (latency, throughput): the point at 400 ms / 400 tok/s is beaten by 300 ms / 900.
    assert figures.pareto_front([(50, 120), (400, 400), (300, 900)]) == [0, 2]
    fig = figures.pareto_figure("concurrency", results, budget_ms=350)
    points, front = fig["data"]
    assert points["text"] == ["c=1", "c=4", "c=16"]
    assert front["x"] == [50.0, 300.0] and front["y"] == [120.0, 900.0]
    assert fig["layout"]["shapes"][0]["x0"] == 350
    assert figures.pareto_figure("prompt-length", results) is None  # not a load sweep


def test_run_figures_lists_the_charts_of_each_sweep(results):
    ids = [f["id"] for f in figures.run_figures(results)]
    assert ids == [
        "concurrency-output", "concurrency-pareto", "concurrency-ttft", "concurrency-server",
        "prompt-length-output", "prompt-length-ttft",
    ]  # fmt: skip


def test_a_run_with_only_failures_has_no_charts():
    failed = [m("vllm", "vllm", "c", "max_concurrency", 1, 0, 0.0, status="failed")]
    assert figures.run_figures(pts.RunResults(pts.aggregate(failed))) == []


def test_user_strings_are_escaped_for_plotly():
    assert figures.esc('<a href="javascript:x">x</a>') == '&lt;a href="javascript:x"&gt;x&lt;/a&gt;'
