"""The run page's figure builder: series per sweep, repeats averaged, HF as reference."""

from __future__ import annotations

import pytest

from portal.web import figures


def row(backend, kind, sweep, axis, value, repeat, out, p99_ttft=100.0, status="succeeded"):
    return {
        "backend": backend,
        "backend_kind": kind,
        "sweep": sweep,
        "axis": axis,
        "value": value,
        "repeat": repeat,
        "status": status,
        "metrics": {
            "output_throughput": out,
            "p50_ttft_ms": p99_ttft / 2,
            "p90_ttft_ms": p99_ttft * 0.9,
            "p99_ttft_ms": p99_ttft,
        },
    }


@pytest.fixture
def rows():
    return [
        row("hf-sequential", "hf-sequential", "baseline", None, None, 0, 50.0),
        row("hf-sequential", "hf-sequential", "baseline", None, None, 1, 70.0),
        row("vllm", "vllm", "concurrency", "max_concurrency", 16, 0, 900.0),
        row("vllm", "vllm", "concurrency", "max_concurrency", 1, 0, 100.0),
        row("vllm", "vllm", "concurrency", "max_concurrency", 1, 1, 140.0),
        row("vllm", "vllm", "concurrency", "max_concurrency", 4, 0, 400.0),
        row("vllm", "vllm", "concurrency", "max_concurrency", 64, 0, 0.0, status="failed"),
        row("vllm", "vllm", "prompt-length", "input_len", 128, 0, 300.0),
    ]


def test_it_groups_by_sweep_sorts_points_and_averages_repeats(rows):
    series, baselines = figures.build_series(rows)
    assert [(s.sweep, s.backend) for s in series] == [
        ("concurrency", "vllm"),
        ("prompt-length", "vllm"),
    ]
    conc = series[0]
    assert conc.xs() == [1.0, 4.0, 16.0]  # the failed point at 64 is not drawn as zero
    assert conc.ys("output_throughput") == [120.0, 400.0, 900.0]
    assert conc.errs("output_throughput")[0] == pytest.approx(28.284, abs=1e-3)
    assert baselines["hf-sequential"]["output_throughput"] == 60.0


def test_throughput_chart_has_the_baseline_line_and_speedup_labels(rows):
    series, baselines = figures.build_series(rows)
    fig = figures.throughput_figure("concurrency", series, baselines)
    names = [t["name"] for t in fig["data"]]
    assert names == ["vllm", "hf-sequential (baseline)"]
    baseline = fig["data"][1]
    assert baseline["y"] == [60.0, 60.0]
    assert baseline["x"] == [1.0, 16.0]
    labels = [a["text"] for a in fig["layout"]["annotations"]]
    assert labels == ["2.0x", "6.7x", "15.0x"]
    assert fig["layout"]["xaxis"]["type"] == "log"  # 1..16 spans a 16x range


def test_latency_chart_draws_p50_p90_p99(rows):
    series, _ = figures.build_series(rows)
    fig = figures.latency_figure("concurrency", series, "ttft")
    assert [t["name"] for t in fig["data"]] == ["vllm p50", "vllm p90", "vllm p99"]
    assert fig["data"][2]["y"] == [100.0, 100.0, 100.0]


def test_run_figures_lists_three_charts_per_sweep(rows):
    ids = [f["id"] for f in figures.run_figures(rows)]
    assert ids == [
        "concurrency-output",
        "concurrency-ttft",
        "concurrency-tpot",
        "prompt-length-output",
        "prompt-length-ttft",
        "prompt-length-tpot",
    ]


def test_a_run_with_only_failures_has_no_charts():
    failed = [row("vllm", "vllm", "c", "max_concurrency", 1, 0, 0.0, status="failed")]
    assert figures.run_figures(failed) == []
