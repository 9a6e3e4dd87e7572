"""The verdict engine on constructed sample sets (pure Python, no services): the policy
(``servebench.verdict``) and the statistics it stands on (``servebench.stats``)."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from servebench import render, stats
from servebench import verdict as v
from servebench.compare import compare_documents

DATA = Path(__file__).resolve().parents[1] / "runners" / "data"


def side(
    shift: float,
    seed: int,
    *,
    n: int = 200,
    repeats: int = 1,
    spread: float = 0.3,
    drift: tuple[float, ...] = (),
) -> v.Side:
    """Repeats of one point: lognormal TTFTs and token gaps (seconds), scaled by 1 + shift
    (and repeat i by ``drift[i]``: run-to-run noise), with every metric the bench client
    reports computed from them as vLLM does."""
    rng = random.Random(seed)
    metrics, details = [], []
    for i in range(repeats):
        scale = (1.0 + shift) * (drift[i] if drift else 1.0)
        ttfts = [rng.lognormvariate(-3, spread) * scale for _ in range(n)]
        itls = [[rng.lognormvariate(-5, spread) * scale for _ in range(31)] for _ in range(n)]
        latencies = [t + sum(g) for t, g in zip(ttfts, itls, strict=True)]
        detail = {
            "ttfts": ttfts,
            "itls": itls,
            "latencies": latencies,
            "output_lens": [32] * n,
            "input_lens": [128] * n,
        }
        reported = {"output_throughput": 4 * 32 * n / sum(latencies)}
        for name in v.LATENCY_NAMES:
            values = sorted(stats.latency_samples(detail, name))
            reported[f"mean_{name}_ms"] = statistics.fmean(values)
            reported[f"median_{name}_ms"] = stats.percentile(values, 50)
            for p in (90, 99):
                reported[f"p{p}_{name}_ms"] = stats.percentile(values, p)
        metrics.append(reported)
        details.append(detail)
    return v.Side(metrics, details)


def verdicts(base: v.Side, cand: v.Side, **kwargs) -> dict[str, v.MetricVerdict]:
    return {m: v.compare_metric(m, base, cand, **kwargs) for m in v.DEFAULT_METRICS}


# --------------------------------------------------------------------------- the policy


@pytest.mark.parametrize(
    ("change", "noise", "requests", "better", "expected"),
    [
        # Within the threshold: too small to matter, whatever the noise.
        (-0.03, None, None, "higher", v.THRESHOLD),
        (-0.03, (-0.04, -0.02), (-0.035, -0.025), "higher", v.THRESHOLD),
        (0.05, None, None, "lower", v.THRESHOLD),
        # Beyond it, with run-to-run noise: the interval decides.
        (-0.10, (-0.15, -0.05), None, "higher", v.WORSE),
        (-0.10, (-0.25, 0.05), None, "higher", v.NOISE),
        (0.10, (0.05, 0.15), None, "higher", v.BETTER),
        (0.10, (0.05, 0.15), None, "lower", v.WORSE),
        (-0.10, (-0.15, -0.05), None, "lower", v.BETTER),
        # The request-level interval can only widen the run-to-run one.
        (-0.10, (-0.15, -0.05), (-0.2, 0.01), "higher", v.NOISE),
        (-0.10, (-0.15, -0.05), (-0.11, -0.09), "higher", v.WORSE),
        # Without run-to-run noise a change beyond the threshold is never a regression.
        (-0.40, None, (-0.45, -0.35), "higher", v.UNMEASURED),
        (0.40, None, None, "lower", v.UNMEASURED),
        (0.40, None, (-0.1, 0.9), "lower", v.UNMEASURED),  # requests alone decide nothing
    ],
)
def test_decide(change, noise, requests, better, expected):
    assert v.decide(change, noise, requests, better, 0.05) == expected


def test_one_repeat_without_history_never_fails_a_build():
    # A real 20% slowdown, measured once each: requests alone cannot tell it from
    # run-to-run noise, so the verdict says the noise was not measured.
    results = verdicts(side(0, 1, n=1000), side(0.2, 2, n=1000))
    for metric, result in results.items():
        assert result.verdict == v.UNMEASURED, (metric, result)
        assert not result.regressed and result.coloured == ""
        assert result.noise == "not measured"
        assert result.interval is None  # a request-level interval would suggest otherwise
        assert any("run-to-run noise was not measured" in n for n in result.notes)
    # What the requests alone would have said: a tight interval excluding zero.
    change = results["median_tpot_ms"].change
    base, cand = side(0, 1, n=1000), side(0.2, 2, n=1000)
    (low, _high), _method = v.request_interval("median_tpot_ms", base, cand, change)
    assert low > 0.1


def test_an_a_a_pair_with_run_to_run_drift_is_no_regression():
    # The same configuration twice, each run 15% off by chance (a neighbour, a thermal
    # state): the old rule (request-level intervals decide) called this a regression.
    base, cand = side(0, 1, n=1000), side(-0.15, 2, n=1000)
    for metric, result in verdicts(base, cand).items():
        assert result.verdict in (v.UNMEASURED, v.NOISE, v.THRESHOLD), (metric, result)


def test_repeats_measure_the_noise_and_a_20_percent_shift_is_a_regression():
    results = verdicts(side(0, 1, n=1000, repeats=3), side(0.2, 2, n=1000, repeats=3))
    for metric, result in results.items():
        assert result.verdict == v.WORSE, (metric, result)
        assert result.noise == "repeats" and "repeats" in result.method
        lo, hi = result.interval
        assert (lo > 0) if result.better == "lower" else (hi < 0)
    better = verdicts(side(0, 1, n=1000, repeats=3), side(-0.2, 2, n=1000, repeats=3))
    assert {r.verdict for r in better.values()} == {v.BETTER}


def test_repeats_that_drift_apart_are_within_noise():
    # Each repeat moves by ~15% from run to run: an 11% difference of means is noise.
    base = side(0, 1, n=500, repeats=3, drift=(1.0, 1.2, 0.85))
    cand = side(0, 2, n=500, repeats=3, drift=(1.15, 0.95, 1.3))
    result = v.compare_metric("median_tpot_ms", base, cand)
    assert result.change == pytest.approx(0.11, abs=0.02)
    assert result.verdict == v.NOISE, result


def test_history_measures_the_noise_of_single_runs():
    base = v.Side([{"output_throughput": 100.0}])
    worse = v.Side([{"output_throughput": 80.0}])
    slight = v.Side([{"output_throughput": 92.0}])
    quiet = [100.0, 101.0, 99.0, 100.5, 99.5]
    noisy = [100.0, 70.0, 130.0, 95.0, 110.0]
    result = v.compare_metric("output_throughput", base, worse, history=quiet)
    assert (result.verdict, result.noise, result.history_runs) == (v.WORSE, "history", 5)
    # By hand: t(0.975, 4) * sd(ln history) * sqrt(2) around ln(0.8).
    half = stats.t_quantile(0.975, 4) * statistics.stdev(map(math.log, quiet)) * math.sqrt(2)
    assert result.interval == pytest.approx(
        (math.exp(math.log(0.8) - half) - 1, math.exp(math.log(0.8) + half) - 1)
    )
    assert v.compare_metric("output_throughput", base, worse, history=noisy).verdict == v.NOISE
    assert v.compare_metric("output_throughput", base, slight, history=quiet).verdict == v.WORSE
    # Too short a history measures nothing.
    short = v.compare_metric("output_throughput", base, worse, history=quiet[: v.MIN_HISTORY - 1])
    assert (short.verdict, short.noise) == (v.UNMEASURED, "not measured")


def test_repeats_and_history_keep_the_wider_interval():
    base = v.Side([{"output_throughput": x} for x in (100.0, 101.0, 99.0)])
    cand = v.Side([{"output_throughput": x} for x in (80.0, 81.0, 79.0)])
    both = v.compare_metric("output_throughput", base, cand, history=[100, 60, 140, 90])
    alone = v.compare_metric("output_throughput", base, cand)
    assert both.noise == "repeats + history" and alone.noise == "repeats"
    assert both.interval[0] < alone.interval[0] and both.interval[1] > alone.interval[1]
    assert (alone.verdict, both.verdict) == (v.WORSE, v.NOISE)


def test_throughput_with_repeats_uses_welch_over_the_repeats():
    base = v.Side([{"output_throughput": x} for x in (100.0, 102.0, 98.0)])
    cand = v.Side([{"output_throughput": x} for x in (80.0, 81.0, 79.0)])
    result = v.compare_metric("output_throughput", base, cand)
    assert result.method == "repeats" and "Welch t over 3 vs 3 repeats" in result.detail
    assert result.change == pytest.approx(-0.2)
    # Welch by hand: se = sqrt(4/3 + 1/3), df = (5/3)^2 / ((4/3)^2/2 + (1/3)^2/2)
    se = (4 / 3 + 1 / 3) ** 0.5
    df = (5 / 3) ** 2 / ((4 / 3) ** 2 / 2 + (1 / 3) ** 2 / 2)
    t = v.t_quantile(0.975, df)
    assert result.interval == pytest.approx(((-20 - t * se) / 100, (-20 + t * se) / 100))
    assert result.verdict == v.WORSE


def test_one_side_with_repeats_lends_its_spread():
    base = v.Side([{"output_throughput": x} for x in (100.0, 101.0, 99.0)])
    cand = v.Side([{"output_throughput": 80.0}])
    result = v.compare_metric("output_throughput", base, cand)
    assert result.verdict == v.WORSE and "the other side has 1" in result.detail


def test_a_p99_of_few_requests_cannot_fail_a_build():
    # 64 requests: the p99 is the largest sample or so, and a bootstrap (which never
    # exceeds the sample maximum) would be overconfident. Order statistics say the
    # percentile may lie above every sample: the interval is open, the verdict noise.
    base, cand = side(0, 1, n=64, repeats=2), side(0.5, 2, n=64, repeats=2)
    result = v.compare_metric("p99_ttft_ms", base, cand)
    assert "order statistics" in result.method
    assert result.interval[1] == math.inf
    assert result.verdict == v.NOISE
    assert any("needs at least 437 requests" in note for note in result.notes)
    assert result.as_dict()["interval"][1] is None  # JSON has no infinity
    assert v.compare_metric("median_ttft_ms", base, cand).verdict == v.WORSE


def test_a_handful_of_requests_gets_no_bootstrap():
    base = side(0, 1, n=4, repeats=2, drift=(1.0, 1.01))
    cand = side(0.5, 2, n=4, repeats=2, drift=(1.0, 1.01))
    mean = v.compare_metric("mean_e2el_ms", base, cand)
    assert mean.method == "repeats + t interval" and "too few for a bootstrap" in mean.detail
    rate = v.compare_metric("output_throughput", base, cand)
    assert rate.method == "repeats" and rate.noise == "repeats"
    assert any("only 8 requests" in note for note in rate.notes)


def test_samples_are_read_only_where_they_could_change_the_verdict():
    # Within the threshold, or without run-to-run noise, or with a run-to-run interval
    # that already contains zero, the request-level interval cannot change the verdict.
    cases = [
        (side(0, 1), side(0.01, 1), None),  # within the threshold
        (side(0, 1), side(0.3, 2), None),  # noise not measured
        (side(0, 1), side(0.3, 2), [1.0, 3.0, 0.4]),  # a history that wide: within noise
    ]
    for base, cand, history in cases:
        for metric in v.DEFAULT_METRICS:
            assert not v.assess(metric, base, cand, history=history).needs_samples()
            bare = v.compare_metric(
                metric, v.Side(base.metrics), v.Side(cand.metrics), history=history
            )
            full = v.compare_metric(metric, base, cand, history=history)
            assert bare.as_dict() == full.as_dict(), metric
    base, far = side(0, 1, repeats=3), side(0.3, 2, repeats=3)
    for metric in ("output_throughput", "median_tpot_ms"):
        found = v.assess(metric, v.Side(base.metrics), v.Side(far.metrics))
        assert found.needs_samples()
        # Concluding from the assessment without the samples it asked for is what a
        # comparison must not do; with them (assessed again) the verdict is the full one.
        full = v.compare_metric(metric, base, far)
        assert "request" in full.method or "bootstrap" in full.method, full.method
    assert not v.assess("median_tpot_ms", base, far, comparable=False).needs_samples()


def test_a_verdict_concluded_from_its_assessment_is_the_one_computed_whole():
    """A comparison assesses each cell once and concludes from that assessment where no
    samples were needed: the same verdict, field for field, as ``compare_metric`` alone."""
    cases = [
        (side(0, 1), side(0.01, 1), None),
        (side(0, 1), side(0.3, 2), [1.0, 3.0, 0.4]),
        (side(0, 1, repeats=3), side(0.02, 2, repeats=3), None),
        (side(0, 1, repeats=3), side(0.3, 2, repeats=3), [1.0, 1.01, 0.99]),
    ]
    concluded = 0
    for base, cand, history in cases:
        for metric in (*v.DEFAULT_METRICS, "p95_ttft_ms"):
            for comparable in (True, False):
                args = {"history": history, "comparable": comparable}
                found = v.assess(metric, base, cand, **args)
                if found.needs_samples():
                    continue
                whole = v.compare_metric(metric, base, cand, **args)
                again = v.compare_metric(metric, base, cand, **args, assessed=found)
                assert again.as_dict() == whole.as_dict(), (metric, args)
                concluded += 1
    assert concluded > 20


def test_not_comparable_judges_nothing():
    result = v.compare_metric("output_throughput", side(0, 1), side(0.5, 2), comparable=False)
    assert result.verdict == v.NOT_COMPARABLE and result.interval is None
    assert result.change == pytest.approx(result.candidate / result.base - 1)


def test_missing_data():
    base = v.Side([{"output_throughput": 100.0}])
    assert v.compare_metric("p99_ttft_ms", base, v.Side([{}])).verdict == v.NO_DATA
    zero = v.Side([{"output_throughput": 0.0}])
    assert v.compare_metric("output_throughput", zero, base).verdict == v.NO_DATA


def test_the_verdict_is_reproducible_for_a_seed():
    base, cand = side(0, 1), side(0.2, 2)
    a = v.request_interval("p99_itl_ms", base, cand, 0.2, seed=7)
    b = v.request_interval("p99_itl_ms", base, cand, 0.2, seed=7)
    c = v.request_interval("p99_itl_ms", base, cand, 0.2, seed=8)
    assert a == b and a[1] == "bootstrap"
    assert a[0] != c[0]
    three = side(0, 1, repeats=3), side(0.2, 2, repeats=3)
    assert (
        v.compare_metric("p99_itl_ms", *three, seed=7).as_dict()
        == v.compare_metric("p99_itl_ms", *three, seed=7).as_dict()
    )


def test_a_statistic_the_client_did_not_report_is_recomputed_from_samples():
    base, cand = side(0, 1, repeats=2), side(0.3, 2, repeats=2)
    result = v.compare_metric("p95_ttft_ms", base, cand)
    expected = [stats.statistic(stats.latency_samples(d, "ttft"), 95) for d in base.details]
    assert result.base == pytest.approx(statistics.fmean(expected))
    assert v.assess("p95_ttft_ms", v.Side(base.metrics), v.Side(cand.metrics)).needs_samples()


# --------------------------------------------------------------------------- statistics


def test_samples_reproduce_vllms_reported_statistics():
    data = json.loads((DATA / "vllm-0.32-bench-serve-c8-detailed.json").read_text())
    for name in ("ttft", "tpot", "itl", "e2el"):
        values = sorted(stats.latency_samples(data, name))
        assert statistics.fmean(values) == pytest.approx(data[f"mean_{name}_ms"], rel=1e-9)
        assert stats.percentile(values, 50) == pytest.approx(data[f"median_{name}_ms"], rel=1e-9)
        assert stats.percentile(values, 99) == pytest.approx(data[f"p99_{name}_ms"], rel=1e-9)


@pytest.mark.parametrize("n", [40, 400])
def test_order_statistic_bootstrap_equals_resampling(n):
    rng = random.Random(1)
    xs = [rng.lognormvariate(0, 0.5) for _ in range(n)]
    for q in (50.0, 90.0, 99.0, None):
        fast = sorted(stats.bootstrap_replicates(xs, q, 20000, random.Random(2)))
        slow_rng = random.Random(3)
        slow = sorted(stats.statistic(slow_rng.choices(xs, k=len(xs)), q) for _ in range(4000))
        for p in (2.5, 50, 97.5):
            got, want = stats.percentile(fast, p), stats.percentile(slow, p)
            assert got == pytest.approx(want, rel=0.03), (n, q, p)


def test_order_statistic_bounds_cover_the_true_percentile():
    # Exponential(1): the true p90 is ln(10). Each bound is built to fail at most 2.5%.
    rng = random.Random(5)
    truth = math.log(10)
    misses = 0
    for _ in range(400):
        lo, hi = stats.quantile_bounds([rng.expovariate(1) for _ in range(40)], 90, 0.95)
        misses += not (lo <= truth <= hi)
    assert misses / 400 <= 0.06


def test_history_intervals_cover_the_difference_of_two_new_runs():
    # Runs of one series vary by 10% (lognormal): the interval of two new runs' ratio
    # built from 5 earlier ones should miss at most ~5% of the time.
    rng = random.Random(9)
    misses = 0
    trials = 2000
    for _ in range(trials):
        runs = [100 * rng.lognormvariate(0, 0.1) for _ in range(7)]
        lo, hi = stats.history_interval(runs[:5], runs[5], runs[6], 0.95)
        misses += not (lo <= 0.0 <= hi)
    assert misses / trials <= 0.065


def test_value_intervals_for_pages():
    rng = random.Random(4)
    xs = [rng.expovariate(1) for _ in range(5000)]
    (lo, hi), method = stats.value_interval(xs, 90.0, 0.95)
    assert method == "order statistics" and lo < math.log(10) < hi
    (lo, hi), method = stats.value_interval(xs, None, 0.95)
    assert method == "t interval" and lo < 1.0 < hi
    (lo, hi), _ = stats.value_interval(xs[:20], 99.0, 0.95)
    assert hi == math.inf  # 20 samples cannot bound a p99
    nums, dens = [32.0] * 100, [rng.uniform(0.9, 1.1) for _ in range(100)]
    (lo, hi), method = stats.rate_interval(nums, dens, 500.0, 0.95)
    assert method == "request-level" and lo < 500.0 < hi and hi - lo < 50


def test_t_quantiles():
    for df, expected in [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042)]:
        assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-3)


def test_metric_and_threshold_parsing():
    assert v.parse_metric("p50_ttft_ms").key == "median_ttft_ms"
    assert v.parse_metric("p95_itl_ms").quantile == 95
    assert v.parse_metric("output_throughput").better == "higher"
    assert v.parse_metric("mean_e2el_ms").quantile is None
    assert v.judged_metric("preemptions") is None
    with pytest.raises(ValueError, match="unknown metric 'tokens'"):
        v.parse_metric("tokens")
    assert v.parse_threshold("5%") == pytest.approx(0.05)
    assert v.parse_threshold("0.1") == pytest.approx(0.1)
    with pytest.raises(ValueError, match=r"write a percentage \(5%\)"):
        v.parse_threshold("5")


# --------------------------------------------------------------------------- documents


def _doc(
    name: str, shift: float, seed: int, *, repeats: int = 2, dtype: str = "bfloat16", seq: int = 0
):
    s = side(shift, seed, n=200, repeats=repeats)
    spec = {
        "model": {"id": "org/tiny-model", "dtype": dtype},
        "workload": {"seed": seq},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [4, 8]}],
        "backends": [{"kind": "vllm", "name": name}],
    }
    point = {"key": "concurrency:max_concurrency=4"}
    failed = {"key": "concurrency:max_concurrency=8"}
    return {
        "spec": spec,
        "environment": {"gpu": {"model": "NVIDIA H100 80GB HBM3", "count": 1}},
        "measurements": [
            {"backend": name, "backend_kind": "vllm", "point": point, "repeat": r,
             "status": "succeeded", "metrics": s.metrics[r], "detail": s.details[r]}
            for r in range(repeats)
        ] + [
            {"backend": name, "backend_kind": "vllm", "point": failed, "repeat": 0,
             "status": "failed", "metrics": {}, "detail": {}},
        ],
    }  # fmt: skip


def test_documents_match_points_by_backend_kind():
    comparison = compare_documents(_doc("vllm-main", 0, 1), _doc("vllm-pr", 0.3, 2))
    assert comparison.comparable  # a backend's name is not in the fingerprint
    assert [p.label for p in comparison.points] == ["vllm concurrency:max_concurrency=4"]
    assert comparison.regressed
    assert comparison.only_base == comparison.only_candidate == []
    assert set(comparison.as_dict()) >= {"regressed", "points", "verdicts", "seed", "comparable"}


def test_documents_of_different_workloads_are_not_comparable():
    comparison = compare_documents(_doc("vllm", 0, 1), _doc("vllm", 0.3, 2, seq=7))
    assert not comparison.comparable and not comparison.regressed
    assert comparison.differences == ["workload.seed: 0 vs 7"]
    assert {v.verdict for p in comparison.points for v in p.verdicts} == {v.NOT_COMPARABLE}


def test_documents_of_different_configurations_judge_the_change():
    comparison = compare_documents(_doc("vllm", 0, 1), _doc("vllm", 0.3, 2, dtype="float16"))
    assert comparison.comparable and comparison.regressed
    assert comparison.changes == ["model.dtype: bfloat16 → float16"]
    assert "quality of the answers is not measured" in comparison.quality_note
    # A pull-request comment names each change as typed (code, not escaped Markdown).
    summary = render.comparison_markdown(comparison, {}, {})
    assert "**What changed:** `model.dtype: bfloat16 → float16`" in summary


def test_documents_take_the_series_history():
    base, cand = _doc("vllm", 0, 1, repeats=1), _doc("vllm", 0.2, 2, repeats=1)
    alone = compare_documents(base, cand, ["output_throughput"])
    assert alone.points[0].verdicts[0].verdict == v.UNMEASURED and not alone.regressed
    value = base["measurements"][0]["metrics"]["output_throughput"]
    history = {("vllm", "concurrency:max_concurrency=4"): {"output_throughput": [value] * 2 + [
        value * 1.01, value * 0.99]}}  # fmt: skip
    judged = compare_documents(base, cand, ["output_throughput"], history=history)
    assert judged.points[0].verdicts[0].verdict == v.WORSE and judged.regressed
    # p50 history keys are read as the engine's median keys.
    history[("vllm", "concurrency:max_concurrency=4")]["p50_tpot_ms"] = [1.0, 1.01, 0.99]
    assert compare_documents(base, cand, ["median_tpot_ms"], history=history).regressed


def test_a_zero_statistic_is_no_data_and_never_a_crash():
    # On CPU the server may stream several tokens in one chunk: median TPOT can be 0.
    zero = {"ttfts": [0.01] * 20, "latencies": [0.01] * 20, "output_lens": [32] * 20}
    some = {"ttfts": [0.01] * 20, "latencies": [0.05] * 20, "output_lens": [32] * 20}
    base = v.Side([{"median_tpot_ms": 0.0}, {"median_tpot_ms": 0.5}], [zero, zero])
    cand = v.Side([{"median_tpot_ms": 1.3}, {"median_tpot_ms": 1.3}], [some, some])
    result = v.compare_metric("median_tpot_ms", base, cand)
    assert result.verdict in v.VERDICTS and result.noise == "repeats"
    assert v.compare_metric("median_tpot_ms", v.Side([{"median_tpot_ms": 0.0}]), cand).verdict == (
        v.NO_DATA
    )
