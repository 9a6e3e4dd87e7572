"""The noise-aware verdict on constructed sample sets (pure Python, no services)."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest

from servebench import verdict as v
from servebench.compare import compare_documents

DATA = Path(__file__).resolve().parents[1] / "runners" / "data"
LATENCY_METRICS = [m for m in v.DEFAULT_METRICS if m.endswith("_ms")]


def side(shift: float, seed: int, *, n: int = 200, repeats: int = 1, spread: float = 0.3):
    """Repeats of one point: lognormal TTFTs and token gaps (seconds), scaled by 1 + shift,
    with the throughput a saturated client at concurrency 4 would report."""
    rng = random.Random(seed)
    metrics, details = [], []
    for _ in range(repeats):
        scale = 1.0 + shift
        ttfts = [rng.lognormvariate(-3, spread) * scale for _ in range(n)]
        itls = [[rng.lognormvariate(-5, spread) * scale for _ in range(31)] for _ in range(n)]
        latencies = [t + sum(g) for t, g in zip(ttfts, itls, strict=True)]
        details.append(
            {
                "ttfts": ttfts,
                "itls": itls,
                "latencies": latencies,
                "output_lens": [32] * n,
                "input_lens": [128] * n,
            }
        )
        metrics.append({"output_throughput": 4 * 32 * n / sum(latencies)})
    return v.Side(metrics, details)


def verdicts(base, cand, **kwargs) -> dict[str, v.MetricVerdict]:
    return {m: v.compare_metric(m, base, cand, **kwargs) for m in v.DEFAULT_METRICS}


# --------------------------------------------------------------------------- the three cases


def test_identical_distributions_are_within_noise():
    same = verdicts(side(0, 1), side(0, 1))
    for metric, result in same.items():
        assert result.change == 0, metric
        assert result.verdict == v.NOISE, (metric, result)
    # Independent draws from one distribution: never a regression, never "better".
    for metric, result in verdicts(side(0, 1), side(0, 2)).items():
        assert result.verdict in (v.NOISE, v.THRESHOLD), (metric, result)
        assert result.interval is not None and result.method != "threshold only"


def test_a_20_percent_shift_is_a_regression():
    # 1000 requests: ten lie beyond the p99, enough for a bounded interval.
    results = verdicts(side(0, 1, n=1000), side(0.2, 2, n=1000))
    for metric, result in results.items():
        assert result.verdict == v.WORSE, (metric, result)
        assert result.regressed
        lo, hi = result.interval
        if result.better == "lower":
            assert result.change > 0.1 and lo > 0
        else:
            assert result.change < -0.1 and hi < 0


def test_a_20_percent_improvement_is_better_not_a_regression():
    for metric, result in verdicts(side(0, 1, n=1000), side(-0.2, 2, n=1000)).items():
        assert result.verdict == v.BETTER, (metric, result)


def test_a_3_percent_shift_with_a_5_percent_threshold_is_within_threshold():
    # Narrow distributions and many requests: the 3% shift is real (interval excludes 0)
    # but smaller than the threshold.
    base, cand = side(0, 1, n=2000, spread=0.05), side(0.03, 2, n=2000, spread=0.05)
    for metric in ("median_ttft_ms", "median_tpot_ms", "p99_e2el_ms", "output_throughput"):
        result = v.compare_metric(metric, base, cand, threshold=0.05)
        lo, hi = result.interval
        assert not lo <= 0 <= hi, (metric, result)
        assert result.verdict == v.THRESHOLD, (metric, result)
        # The same data with a 2% threshold is a regression: the threshold decides.
        assert v.compare_metric(metric, base, cand, threshold=0.02).verdict == v.WORSE


def test_a_large_change_inside_the_noise_is_within_noise():
    base, cand = side(0, 1, n=8, spread=1.0), side(0.2, 2, n=8, spread=1.0)
    for metric in ("median_ttft_ms", "mean_ttft_ms", "p99_ttft_ms"):
        result = v.compare_metric(metric, base, cand)
        assert result.verdict == v.NOISE, (metric, result)


def test_a_p99_of_few_requests_cannot_fail_a_build():
    # 64 requests: the p99 is the largest sample or so, and a bootstrap (which never
    # exceeds the sample maximum) would be overconfident. Order statistics say the
    # percentile may lie above every sample: the interval is open, the verdict noise.
    base, cand = side(0, 1, n=64), side(0.5, 2, n=64)
    result = v.compare_metric("p99_ttft_ms", base, cand)
    assert result.method == "order statistics"
    assert result.interval[1] == float("inf")
    assert result.verdict == v.NOISE
    assert any("needs at least 437 requests" in note for note in result.notes)
    assert result.as_dict()["interval"][1] is None  # JSON has no infinity
    # The median of the same requests has plenty of samples on both sides.
    assert v.compare_metric("median_ttft_ms", base, cand).verdict == v.WORSE
    # p90 of 64: few beyond it, but bounded: a 50% shift is still caught.
    p90 = v.compare_metric("p90_ttft_ms", base, cand)
    assert p90.method == "order statistics" and p90.verdict == v.WORSE, p90


def test_a_handful_of_requests_gets_no_bootstrap():
    # Four requests (an HF baseline's usual count): a bootstrap would be overconfident.
    base, cand = side(0, 1, n=4), side(0.5, 2, n=4)
    mean = v.compare_metric("mean_e2el_ms", base, cand)
    assert mean.method == "t interval" and "too few for a bootstrap" in mean.detail
    rate = v.compare_metric("output_throughput", base, cand)
    assert rate.method == "threshold only" and rate.interval is None
    assert any("only 4 requests" in note for note in rate.notes)
    assert rate.verdict == v.WORSE  # a -33% change is beyond the threshold on its own


def test_order_statistic_bounds_cover_the_true_percentile():
    # Exponential(1): the true p90 is ln(10). Each bound is built to fail at most 2.5%.
    rng = random.Random(5)
    truth = math.log(10)
    misses = 0
    for _ in range(400):
        lo, hi = v.quantile_bounds([rng.expovariate(1) for _ in range(40)], 90, 0.95)
        misses += not (lo <= truth <= hi)
    assert misses / 400 <= 0.06


# --------------------------------------------------------------------------- methods


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


def test_throughput_repeats_that_overlap_are_within_noise():
    base = v.Side([{"output_throughput": x} for x in (100.0, 120.0, 80.0)])
    cand = v.Side([{"output_throughput": x} for x in (90.0, 70.0, 110.0)])
    assert v.compare_metric("output_throughput", base, cand).verdict == v.NOISE


def test_one_repeat_throughput_says_which_noise_it_saw():
    result = v.compare_metric("output_throughput", side(0, 1), side(0.2, 2))
    assert result.method == "request-rate bootstrap"
    assert "1 repeat" in result.detail
    assert any("request-to-request noise only" in note for note in result.notes)


def test_latency_with_repeats_keeps_the_wider_interval():
    base, cand = side(0, 1, repeats=3, n=100), side(0.02, 2, repeats=3, n=100)
    result = v.compare_metric("median_ttft_ms", base, cand)
    assert result.method == "bootstrap + repeats"
    boot_only = v.compare_metric(
        "median_ttft_ms", v.Side([], base.details), v.Side([], cand.details)
    )
    assert result.interval[0] <= boot_only.interval[0]
    assert result.interval[1] >= boot_only.interval[1]


def test_without_samples_or_repeats_the_threshold_alone_decides():
    base = v.Side([{"output_throughput": 100.0, "p99_ttft_ms": 50.0}])
    worse = v.Side([{"output_throughput": 90.0, "p99_ttft_ms": 56.0}])
    slight = v.Side([{"output_throughput": 97.0, "p99_ttft_ms": 51.0}])
    for metric in ("output_throughput", "p99_ttft_ms"):
        result = v.compare_metric(metric, base, worse)
        assert (result.verdict, result.method, result.interval) == (v.WORSE, "threshold only", None)
        assert v.compare_metric(metric, base, slight).verdict == v.THRESHOLD
    assert v.compare_metric("p99_ttft_ms", base, v.Side([{}])).verdict == v.NO_DATA


def test_the_verdict_is_reproducible_for_a_seed():
    a = v.compare_metric("p99_itl_ms", side(0, 1), side(0.05, 2), seed=7)
    b = v.compare_metric("p99_itl_ms", side(0, 1), side(0.05, 2), seed=7)
    c = v.compare_metric("p99_itl_ms", side(0, 1), side(0.05, 2), seed=8)
    assert a.interval == b.interval
    assert a.interval != c.interval


@pytest.mark.parametrize(
    ("change", "interval", "better", "expected"),
    [
        (-0.10, (-0.15, -0.05), "higher", v.WORSE),
        (-0.10, (-0.25, 0.05), "higher", v.NOISE),
        (-0.03, (-0.04, -0.02), "higher", v.THRESHOLD),
        (0.10, (0.05, 0.15), "higher", v.BETTER),
        (0.10, (0.05, 0.15), "lower", v.WORSE),
        (-0.10, (-0.15, -0.05), "lower", v.BETTER),
        (0.10, None, "lower", v.WORSE),
        (0.04, None, "lower", v.THRESHOLD),
    ],
)
def test_decide(change, interval, better, expected):
    assert v.decide(change, interval, better, 0.05) == expected


# --------------------------------------------------------------------------- statistics


def test_samples_reproduce_vllms_reported_statistics():
    data = json.loads((DATA / "vllm-0.32-bench-serve-c8-detailed.json").read_text())
    for name in ("ttft", "tpot", "itl", "e2el"):
        values = sorted(v.latency_samples(data, name))
        assert statistics.fmean(values) == pytest.approx(data[f"mean_{name}_ms"], rel=1e-9)
        assert v.percentile(values, 50) == pytest.approx(data[f"median_{name}_ms"], rel=1e-9)
        assert v.percentile(values, 99) == pytest.approx(data[f"p99_{name}_ms"], rel=1e-9)


def test_order_statistic_bootstrap_equals_resampling():
    rng = random.Random(1)
    xs = [rng.lognormvariate(0, 0.5) for _ in range(40)]
    for q in (50.0, 90.0, 99.0, None):
        fast = sorted(v.bootstrap_replicates(xs, q, 20000, random.Random(2)))
        slow_rng = random.Random(3)
        slow = sorted(v.statistic(slow_rng.choices(xs, k=len(xs)), q) for _ in range(20000))
        for p in (2.5, 50, 97.5):
            assert v.percentile(fast, p) == pytest.approx(v.percentile(slow, p), rel=0.02), (q, p)


def test_t_quantiles():
    for df, expected in [(1, 12.706), (2, 4.303), (5, 2.571), (10, 2.228), (30, 2.042)]:
        assert v.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-3)


def test_metric_and_threshold_parsing():
    assert v.parse_metric("p50_ttft_ms").key == "median_ttft_ms"
    assert v.parse_metric("p95_itl_ms").quantile == 95
    assert v.parse_metric("output_throughput").better == "higher"
    assert v.parse_metric("mean_e2el_ms").quantile is None
    with pytest.raises(ValueError, match="unknown metric 'tokens'"):
        v.parse_metric("tokens")
    assert v.parse_threshold("5%") == pytest.approx(0.05)
    assert v.parse_threshold("0.1") == pytest.approx(0.1)
    with pytest.raises(ValueError, match=r"write a percentage \(5%\)"):
        v.parse_threshold("5")


def test_documents_match_points_by_backend_kind():
    def doc(name: str, shift: float, seed: int) -> dict:
        s = side(shift, seed, n=50)
        return {
            "measurements": [
                {
                    "backend": name,
                    "backend_kind": "vllm",
                    "point": {"key": "concurrency:max_concurrency=4"},
                    "repeat": 0,
                    "status": "succeeded",
                    "metrics": s.metrics[0],
                    "detail": s.details[0],
                },
                {
                    "backend": name,
                    "backend_kind": "vllm",
                    "point": {"key": "concurrency:max_concurrency=8"},
                    "repeat": 0,
                    "status": "failed",
                    "metrics": {},
                    "detail": {},
                },
            ]
        }

    comparison = compare_documents(doc("vllm-main", 0, 1), doc("vllm-pr", 0.3, 2))
    assert [p.label for p in comparison.points] == ["vllm concurrency:max_concurrency=4"]
    assert comparison.regressed
    assert comparison.only_base == comparison.only_candidate == []
    assert set(comparison.as_dict()) >= {"regressed", "points", "verdicts", "seed"}
