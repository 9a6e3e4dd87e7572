"""Noise-aware verdicts: did a metric change by more than the threshold *and* by more than
the noise?

A CI gate that fails on every 2% wobble is switched off within a week; one that passes a
20% regression because "benchmarks are noisy" is worse. So a change counts as a
regression only when both hold:

1. the relative change of the metric is worse than the threshold (``--threshold 5%``), and
2. its confidence interval (95% by default) excludes zero: the difference is larger than
   what the data says the noise is.

Where the noise estimate comes from, per metric (``MetricVerdict.method`` names it, and
the interval is always reported):

- **Latency** (TTFT, TPOT, ITL, E2E; lower is better): vLLM's bench client saves every
  request's TTFT, inter-token gaps and latency. The statistic (mean, median, p90, p99...)
  is recomputed from those samples exactly as vLLM computes it, and a seeded bootstrap
  (``n_boot`` resamples of each run's requests, repeats pooled) gives the percentile
  interval of ``candidate / base - 1``. Percentiles are resampled exactly through order
  statistics (the k-th smallest of n draws from the samples is the sample at
  ``ceil(n * U)`` with ``U ~ Beta(k, n - k + 1)``), so a p99 over 100,000 token gaps costs
  no more than one over 16 requests. With two or more repeats on a side, a Welch t
  interval over the per-repeat values is computed too and the wider bound of each end is
  kept: run-to-run drift that the requests of one run cannot show is not hidden.
  Small samples get methods that stay honest where a bootstrap would not: a percentile
  with fewer than ``TAIL_MIN`` samples beyond it (p99 of fewer than 1,000 requests) gets
  a distribution-free interval from each run's order statistics (binomial, Bonferroni
  across the two runs), open-ended (infinite) when the sample cannot bound it at all; a
  mean of fewer than ``MIN_SAMPLES`` requests gets a Welch t interval.
- **Throughput** (higher is better) has one number per run, so its noise is the spread
  across repeats: a Welch t interval of the difference of the repeat means (a t interval
  with the known side's spread when only one side has repeats). With one repeat on each
  side the fallback is a bootstrap of the per-request output rate (output tokens /
  latency, summed over the resampled requests), centred on the measured change: it sees
  request-to-request noise, not run-to-run noise, and the method string says so.
- Without samples or repeats (or with fewer than ``MIN_SAMPLES`` requests for a rate) the
  verdict uses the threshold alone (``threshold only``), and a note says so.

Verdicts: ``better`` / ``worse`` (beyond the threshold and beyond the noise),
``within noise`` (the interval contains zero, whatever the size of the change),
``within threshold`` (a real but small change), ``no data``.

Pure Python (stdlib only), deterministic for a seed, importable by the portal.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

BETTER = "better"
WORSE = "worse"
NOISE = "within noise"
THRESHOLD = "within threshold"
NO_DATA = "no data"
VERDICTS = (BETTER, WORSE, NOISE, THRESHOLD, NO_DATA)

DEFAULT_METRICS = (
    "output_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_itl_ms",
    "p99_e2el_ms",
)
DEFAULT_THRESHOLD = 0.05
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP = 2000

THROUGHPUT_METRICS = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
)
LATENCY_NAMES = ("ttft", "tpot", "itl", "e2el")
# Above this many resampled values per side, means and rates use the bootstrap's normal
# approximation (identical in the limit, and a thousand times cheaper).
_EXACT_BUDGET = 1_000_000
_LATENCY_RE = re.compile(r"^(mean|median|p\d{1,2}(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")

Better = Literal["higher", "lower"]


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    """A metric the verdict knows: vLLM's key, which direction is better, how to sample it."""

    key: str
    better: Better
    latency: str | None = None  # ttft / tpot / itl / e2el
    quantile: float | None = None  # 0..100; None = the mean

    @property
    def is_latency(self) -> bool:
        return self.latency is not None


def parse_metric(name: str) -> Metric:
    """``output_throughput``, ``p99_ttft_ms``, ``median_itl_ms``, ``mean_e2el_ms``, ``p95_tpot_ms``;
    ``p50_*`` is vLLM's ``median_*``. ValueError naming the known forms otherwise."""
    key = name.strip()
    if key in THROUGHPUT_METRICS:
        return Metric(key, "higher")
    if key.startswith("p50_"):
        key = "median_" + key[4:]
    match = _LATENCY_RE.match(key)
    if match:
        stat, latency = match.groups()
        if stat == "mean":
            quantile = None
        elif stat == "median":
            quantile = 50.0
        else:
            quantile = float(stat[1:])
            if not 0 < quantile < 100:
                raise ValueError(f"{name!r}: a percentile is between p0 and p100 exclusive")
        return Metric(key, "lower", latency, quantile)
    raise ValueError(
        f"unknown metric {name!r}; use one of {', '.join(THROUGHPUT_METRICS)} or "
        "<stat>_<ttft|tpot|itl|e2el>_ms with stat mean, median, p50, p90, p99 (any pNN)"
    )


# --------------------------------------------------------------------------- samples


def _ok_indices(detail: Mapping[str, Any], n: int) -> list[int]:
    """Indices of the requests that succeeded (vLLM's ``errors`` is "" for those)."""
    errors = detail.get("errors")
    if isinstance(errors, list) and len(errors) == n:
        return [i for i, e in enumerate(errors) if not e]
    return list(range(n))


def _numbers(values: Any) -> list[float] | None:
    if not isinstance(values, list):
        return None
    out = []
    for v in values:
        if not isinstance(v, int | float) or isinstance(v, bool):
            return None
        out.append(float(v))
    return out


def latency_samples(detail: Mapping[str, Any], latency: str) -> list[float]:
    """Per-request (ITL: per-token-gap) values in ms, computed as vLLM's bench client does:
    TTFT from ``ttfts``, E2E from ``latencies``, TPOT = (latency - ttft) / (output_len - 1)
    for requests with more than one output token, ITL = every gap of ``itls`` flattened.
    Empty when the arrays are missing."""
    if latency == "itl":
        itls = detail.get("itls")
        if not isinstance(itls, list):
            return []
        out: list[float] = []
        for i in _ok_indices(detail, len(itls)):
            gaps = _numbers(itls[i])
            if gaps:
                out.extend(g * 1000.0 for g in gaps)
        return out
    ttfts = _numbers(detail.get("ttfts"))
    latencies = _numbers(detail.get("latencies"))
    if latency == "ttft":
        return [ttfts[i] * 1000.0 for i in _ok_indices(detail, len(ttfts))] if ttfts else []
    if latency == "e2el":
        if not latencies:
            return []
        return [latencies[i] * 1000.0 for i in _ok_indices(detail, len(latencies))]
    if latency == "tpot":
        lens = _numbers(detail.get("output_lens"))
        if not ttfts or not latencies or not lens or not len(ttfts) == len(latencies) == len(lens):
            return []
        return [
            (latencies[i] - ttfts[i]) / (lens[i] - 1) * 1000.0
            for i in _ok_indices(detail, len(lens))
            if lens[i] > 1
        ]
    raise ValueError(f"unknown latency {latency!r}")


def rate_samples(detail: Mapping[str, Any], key: str) -> tuple[list[float], list[float]] | None:
    """(numerators, latencies in s) per request for a throughput metric: output tokens for
    ``output_throughput``, input + output tokens for ``total_token_throughput``, one
    request for ``request_throughput``. None when the arrays are missing."""
    latencies = _numbers(detail.get("latencies"))
    if not latencies:
        return None
    n = len(latencies)
    idx = _ok_indices(detail, n)
    outs = _numbers(detail.get("output_lens"))
    if key == "request_throughput":
        nums = [1.0] * n
    elif key == "output_throughput" and outs and len(outs) == n:
        nums = outs
    elif key == "total_token_throughput" and outs and len(outs) == n:
        ins = _numbers(detail.get("input_lens"))
        if not ins or len(ins) != n:
            return None
        nums = [a + b for a, b in zip(ins, outs, strict=True)]
    else:
        return None
    pairs = [(nums[i], latencies[i]) for i in idx if latencies[i] > 0]
    if len(pairs) < 2:
        return None
    return [p[0] for p in pairs], [p[1] for p in pairs]


@dataclass
class Side:
    """One run's repeats of one point: the reported metrics and the per-request arrays."""

    metrics: list[Mapping[str, Any]] = field(default_factory=list)
    details: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def repeats(self) -> int:
        return len(self.metrics)

    def reported(self, metric: Metric) -> list[float]:
        """The per-repeat values the client reported (``p50`` read as ``median``)."""
        out = []
        for m in self.metrics:
            value = m.get(metric.key)
            if value is None and metric.key.startswith("median_"):
                value = m.get("p50_" + metric.key[len("median_") :])
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.append(float(value))
        return out

    def per_repeat(self, metric: Metric) -> list[float]:
        """One value per repeat: recomputed from the repeat's samples when every repeat
        has them (latency), else as reported."""
        if metric.latency is not None and self.details:
            values = [latency_samples(d, metric.latency) for d in self.details]
            if len(values) == self.repeats and all(values):
                return [statistic(x, metric.quantile) for x in values]
        return self.reported(metric)

    def pooled_latency(self, metric: Metric) -> list[float]:
        assert metric.latency is not None
        out: list[float] = []
        for detail in self.details:
            out.extend(latency_samples(detail, metric.latency))
        return out


# --------------------------------------------------------------------------- statistics


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """numpy's default (linear interpolation) percentile of already sorted values, q in
    0..100: the definition vLLM's bench client reports."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("percentile of no values")
    h = (n - 1) * q / 100.0
    k = math.floor(h)
    if k + 1 >= n:
        return float(sorted_values[-1])
    lo, hi = sorted_values[k], sorted_values[k + 1]
    return float(lo + (h - k) * (hi - lo))


def statistic(values: Sequence[float], quantile: float | None) -> float:
    """The mean (quantile None) or the percentile of ``values``."""
    if quantile is None:
        return math.fsum(values) / len(values)
    return percentile(sorted(values), quantile)


def _order_index(n: int, u: float) -> int:
    # Draws from the empirical distribution: u in ((i-1)/n, i/n] gives the i-th smallest.
    return min(n - 1, max(0, math.ceil(n * u) - 1))


def bootstrap_replicates(
    values: Sequence[float], quantile: float | None, n_boot: int, rng: random.Random
) -> list[float]:
    """``n_boot`` bootstrap replicates of the statistic of ``values``.

    Percentiles: exactly as resampling with replacement would give them, but in O(1) per
    replicate. The resample's k-th smallest value is ``x[ceil(n U) - 1]`` with U the k-th
    smallest of n uniforms, ``Beta(k, n - k + 1)``; the next one up is
    ``U + (1 - U) Beta(1, n - k)`` (the smallest of the n - k uniforms above U). numpy's
    linear interpolation needs those two.
    Means: real resampling while ``n * n_boot`` is affordable, else the bootstrap's normal
    limit ``N(mean, s^2 / n)``.
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("bootstrap of no values")
    if quantile is None:
        if n * n_boot <= _EXACT_BUDGET:
            return [math.fsum(rng.choices(xs, k=n)) / n for _ in range(n_boot)]
        mean = math.fsum(xs) / n
        se = statistics.stdev(xs) / math.sqrt(n) if n > 1 else 0.0
        return [rng.gauss(mean, se) for _ in range(n_boot)]
    h = (n - 1) * quantile / 100.0
    k = math.floor(h)  # 0-based: the (k+1)-th smallest, interpolated toward the (k+2)-th
    frac = h - k
    out = []
    for _ in range(n_boot):
        u = rng.betavariate(k + 1, n - k)
        lo = xs[_order_index(n, u)]
        if frac > 0 and k + 1 < n:
            u2 = u + (1.0 - u) * rng.betavariate(1, n - k - 1)
            hi = xs[_order_index(n, u2)]
            out.append(lo + frac * (hi - lo))
        else:
            out.append(lo)
    return out


def ratio_replicates(
    nums: Sequence[float], dens: Sequence[float], n_boot: int, rng: random.Random
) -> list[float]:
    """Bootstrap replicates of ``sum(nums) / sum(dens)`` over resampled requests (pairs
    kept together); the delta method's normal limit for large samples."""
    n = len(nums)
    ratio = math.fsum(nums) / math.fsum(dens)
    if n * n_boot <= _EXACT_BUDGET:
        out = []
        pairs = list(zip(nums, dens, strict=True))
        for _ in range(n_boot):
            pick = rng.choices(pairs, k=n)
            out.append(sum([p[0] for p in pick]) / sum([p[1] for p in pick]))
        return out
    mean_den = math.fsum(dens) / n
    resid = [a - ratio * b for a, b in zip(nums, dens, strict=True)]
    se = statistics.stdev(resid) / (mean_den * math.sqrt(n))
    return [rng.gauss(ratio, se) for _ in range(n_boot)]


def _betacf(a: float, b: float, x: float) -> float:
    # Continued fraction of the incomplete beta function (modified Lentz).
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (p > 0.5), by bisection."""
    if df > 1e6:
        return statistics.NormalDist().inv_cdf(p)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


def welch_interval(
    base: Sequence[float], cand: Sequence[float], confidence: float
) -> tuple[float, float] | None:
    """Interval of ``mean(cand) / mean(base) - 1`` from the spread across repeats: Welch's
    t when both sides have two or more values; a t interval with the known side's spread
    (assumed equal) when only one does; None when neither does."""
    nb, nc = len(base), len(cand)
    mb, mc = statistics.fmean(base), statistics.fmean(cand)
    if mb == 0 or (nb < 2 and nc < 2):
        return None
    if nb >= 2 and nc >= 2:
        vb, vc = statistics.variance(base), statistics.variance(cand)
        se2 = vb / nb + vc / nc
        num = se2**2
        den = (vb / nb) ** 2 / (nb - 1) + (vc / nc) ** 2 / (nc - 1)
        df = num / den if den > 0 else float(nb + nc - 2)
    else:
        known = base if nb >= 2 else cand
        v = statistics.variance(known)
        se2 = v * (1.0 / nb + 1.0 / nc)
        df = float(len(known) - 1)
    se = math.sqrt(se2)
    t = t_quantile(1.0 - (1.0 - confidence) / 2.0, max(df, 1.0))
    diff = mc - mb
    # Metrics are positive, so candidate / base - 1 > -100% whatever the normal theory says.
    return (max((diff - t * se) / mb, -1.0), (diff + t * se) / mb)


def _percentile_interval(values: list[float], confidence: float) -> tuple[float, float]:
    values.sort()
    alpha = 1.0 - confidence
    return (percentile(values, 100 * alpha / 2), percentile(values, 100 * (1 - alpha / 2)))


TAIL_MIN = 10  # fewer samples than this beyond a percentile: order statistics, not bootstrap
MIN_SAMPLES = 10  # fewer requests than this: no bootstrap of a mean or a rate


def tail_count(n: int, quantile: float) -> float:
    """How many of ``n`` samples lie beyond the ``quantile`` (on its nearer side)."""
    return n * min(quantile, 100.0 - quantile) / 100.0


def _binomial_cdf(n: int, p: float) -> list[float]:
    """P(B <= k) for k = 0..n, B ~ Binomial(n, p), computed in log space."""
    log_p, log_q = math.log(p), math.log1p(-p)
    out, total = [], 0.0
    for k in range(n + 1):
        log_pmf = (
            math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * log_p + (n - k) * log_q
        )  # fmt: skip
        total += math.exp(log_pmf)
        out.append(min(total, 1.0))
    return out


def quantile_bounds(
    values: Sequence[float], quantile: float, level: float
) -> tuple[float | None, float | None]:
    """Distribution-free confidence bounds of a population percentile from order
    statistics: ``[x_(l), x_(u)]`` with l, u from Binomial(n, q) so that each bound holds
    with probability ``1 - (1 - level) / 2``. None where the sample is too small for that
    bound (the percentile may lie beyond the smallest or largest sample)."""
    xs = sorted(values)
    n = len(xs)
    p = quantile / 100.0
    tail = (1.0 - level) / 2.0
    cdf = _binomial_cdf(n, p)
    # x_(l) <= the percentile unless B <= l - 1: keep P(B <= l - 1) <= tail.
    lows = [i for i in range(1, n + 1) if cdf[i - 1] <= tail]
    # x_(u) >= the percentile unless B >= u: need P(B <= u - 1) >= 1 - tail.
    highs = [i for i in range(1, n + 1) if cdf[i - 1] >= 1.0 - tail]
    return (xs[lows[-1] - 1] if lows else None, xs[highs[0] - 1] if highs else None)


def order_statistic_interval(
    base: Sequence[float], cand: Sequence[float], quantile: float, confidence: float
) -> tuple[float, float]:
    """Interval of ``candidate / base - 1`` for a percentile from each run's own
    distribution-free bounds at ``1 - (1 - confidence) / 2`` (Bonferroni: both hold
    together with probability >= ``confidence``). An unbounded end is infinite."""
    level = 1.0 - (1.0 - confidence) / 2.0
    lo_b, hi_b = quantile_bounds(base, quantile, level)
    lo_c, hi_c = quantile_bounds(cand, quantile, level)
    low = lo_c / hi_b - 1.0 if lo_c is not None and hi_b else -math.inf
    high = hi_c / lo_b - 1.0 if hi_c is not None and lo_b else math.inf
    return (low, high)


def samples_for_bounds(quantile: float, confidence: float) -> int:
    """The fewest samples whose order statistics bound the percentile on both sides."""
    level = 1.0 - (1.0 - confidence) / 2.0
    tail = (1.0 - level) / 2.0
    p = min(quantile, 100.0 - quantile) / 100.0
    return math.ceil(math.log(tail) / math.log1p(-p))


# --------------------------------------------------------------------------- verdicts


@dataclass
class MetricVerdict:
    """One metric of one point: the numbers, the interval, the method and the verdict.

    ``change`` and ``interval`` are ``candidate / base - 1`` (0.1 = 10% higher), whatever
    the direction; ``better`` says which direction is good.
    """

    metric: str
    better: Better
    base: float | None
    candidate: float | None
    change: float | None
    interval: tuple[float, float] | None
    verdict: str
    method: str
    detail: str
    threshold: float
    confidence: float
    notes: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return self.verdict == WORSE

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "better": self.better,
            "base": self.base,
            "candidate": self.candidate,
            "change": self.change,
            "interval": (
                [None if math.isinf(x) else x for x in self.interval] if self.interval else None
            ),
            "confidence": self.confidence,
            "threshold": self.threshold,
            "verdict": self.verdict,
            "method": self.method,
            "detail": self.detail,
            "notes": list(self.notes),
        }


def decide(
    change: float,
    interval: tuple[float, float] | None,
    better: Better,
    threshold: float,
) -> str:
    """The verdict from a relative change, its interval (None: noise unknown), the good
    direction and the threshold (a fraction: 0.05 = 5%)."""
    sign = 1.0 if better == "higher" else -1.0
    gain = sign * change  # > 0: an improvement
    if interval is None:
        if gain < -threshold:
            return WORSE
        return BETTER if gain > threshold else THRESHOLD
    lo, hi = sorted((sign * interval[0], sign * interval[1]))
    if lo <= 0.0 <= hi:
        return NOISE
    if abs(gain) <= threshold:
        return THRESHOLD
    return WORSE if hi < 0.0 else BETTER


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def compare_metric(
    metric: Metric | str,
    base: Side,
    cand: Side,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int | str = 0,
) -> MetricVerdict:
    """The verdict on one metric between two runs' repeats of one point (see module doc).

    Deterministic: the bootstrap's generator is seeded with ``seed`` and the metric key.
    """
    m = parse_metric(metric) if isinstance(metric, str) else metric
    rng = random.Random(f"{seed}|{m.key}")  # noqa: S311 - statistics, not secrets
    if m.is_latency:
        return _latency_verdict(m, base, cand, threshold, confidence, n_boot, rng)
    return _throughput_verdict(m, base, cand, threshold, confidence, n_boot, rng)


def _no_data(
    m: Metric, base: float | None, cand: float | None, why: str, thr: float, conf: float
) -> MetricVerdict:
    return MetricVerdict(m.key, m.better, base, cand, None, None, NO_DATA, "none", why, thr, conf)


def _latency_verdict(
    m: Metric,
    base: Side,
    cand: Side,
    threshold: float,
    confidence: float,
    n_boot: int,
    rng: random.Random,
) -> MetricVerdict:
    xb, xc = base.pooled_latency(m), cand.pooled_latency(m)
    rb, rc = base.per_repeat(m), cand.per_repeat(m)
    notes: list[str] = []
    if xb and xc:
        vb, vc = statistic(xb, m.quantile), statistic(xc, m.quantile)
    elif rb and rc:
        vb, vc = statistics.fmean(rb), statistics.fmean(rc)
    else:
        return _no_data(
            m, rb[0] if rb else None, rc[0] if rc else None, "missing", threshold, confidence
        )
    if vb == 0:
        return _no_data(m, vb, vc, "base is zero", threshold, confidence)
    change = vc / vb - 1.0
    interval: tuple[float, float] | None = None
    parts: list[str] = []
    methods: list[str] = []
    if xb and xc:
        unit = "token gaps" if m.latency == "itl" else "requests"
        if m.quantile is not None and min(tail_count(len(xb), m.quantile),
                                          tail_count(len(xc), m.quantile)) < TAIL_MIN:  # fmt: skip
            interval = order_statistic_interval(xb, xc, m.quantile, confidence)
            methods.append("order statistics")
            parts.append(
                f"distribution-free interval of each run's p{m.quantile:g} from its order "
                f"statistics ({len(xb)} vs {len(xc)} {unit}; fewer than {TAIL_MIN} lie beyond "
                "it, where a bootstrap is overconfident)"
            )
            if math.isinf(interval[0]) or math.isinf(interval[1]):
                need = samples_for_bounds(m.quantile, confidence)
                notes.append(
                    f"p{m.quantile:g} needs at least {need} {unit} per run for a bounded "
                    "interval; with fewer it cannot fail a build on noise grounds: raise "
                    "num_prompts"
                )
        elif m.quantile is None and min(len(xb), len(xc)) < MIN_SAMPLES:
            interval = welch_interval(xb, xc, confidence)
            methods.append("t interval")
            parts.append(f"Welch t over {len(xb)} vs {len(xc)} {unit} (too few for a bootstrap)")
        else:
            boot_b = bootstrap_replicates(xb, m.quantile, n_boot, rng)
            boot_c = bootstrap_replicates(xc, m.quantile, n_boot, rng)
            rel = [c / b - 1.0 for b, c in zip(boot_b, boot_c, strict=True) if b > 0]
            interval = _percentile_interval(rel, confidence)
            methods.append("bootstrap")
            parts.append(f"bootstrap {n_boot}x over {len(xb)} vs {len(xc)} {unit}")
    if len(rb) >= 2 or len(rc) >= 2:
        welch = welch_interval(rb, rc, confidence) if rb and rc else None
        if welch is not None:
            methods.append("repeats")
            parts.append(f"Welch t over {len(rb)} vs {len(rc)} repeats")
            if interval is None:
                interval = welch
            else:
                interval = (min(interval[0], welch[0]), max(interval[1], welch[1]))
                notes.append("interval: the wider of the request bootstrap and the repeat spread")
    if interval is None:
        methods.append("threshold only")
        parts.append("no per-request samples and a single repeat: noise not measured")
    verdict = decide(change, interval, m.better, threshold)
    return MetricVerdict(
        m.key,
        m.better,
        vb,
        vc,
        change,
        interval,
        verdict,
        " + ".join(methods),
        "; ".join(parts),
        threshold,
        confidence,
        notes,
    )


def _throughput_verdict(
    m: Metric,
    base: Side,
    cand: Side,
    threshold: float,
    confidence: float,
    n_boot: int,
    rng: random.Random,
) -> MetricVerdict:
    rb, rc = base.reported(m), cand.reported(m)
    if not rb or not rc:
        return _no_data(
            m, rb[0] if rb else None, rc[0] if rc else None, "missing", threshold, confidence
        )
    vb, vc = statistics.fmean(rb), statistics.fmean(rc)
    if vb == 0:
        return _no_data(m, vb, vc, "base is zero", threshold, confidence)
    change = vc / vb - 1.0
    notes: list[str] = []
    interval = welch_interval(rb, rc, confidence)
    if interval is not None:
        if len(rb) >= 2 and len(rc) >= 2:
            method, detail = "repeats", f"Welch t over {len(rb)} vs {len(rc)} repeats"
        else:
            known = "base" if len(rb) >= 2 else "candidate"
            method = "repeats"
            detail = (
                f"t interval with the {known}'s spread over {max(len(rb), len(rc))} repeats "
                "(the other side has 1)"
            )
        return MetricVerdict(
            m.key,
            m.better,
            vb,
            vc,
            change,
            interval,
            decide(change, interval, m.better, threshold),
            method,
            detail,
            threshold,
            confidence,
            notes,
        )
    sb = _pooled_rates(base, m.key)
    sc = _pooled_rates(cand, m.key)
    few = sb is not None and sc is not None and min(len(sb[0]), len(sc[0])) < MIN_SAMPLES
    if few:
        notes.append(
            f"one repeat and only {min(len(sb[0]), len(sc[0]))} requests: too few to "
            "estimate the noise of a throughput; the threshold alone decides"
        )
    elif sb is not None and sc is not None:
        rate_b = math.fsum(sb[0]) / math.fsum(sb[1])
        rate_c = math.fsum(sc[0]) / math.fsum(sc[1])
        boot_b = ratio_replicates(sb[0], sb[1], n_boot, rng)
        boot_c = ratio_replicates(sc[0], sc[1], n_boot, rng)
        rel = [c / b - 1.0 for b, c in zip(boot_b, boot_c, strict=True) if b > 0]
        lo, hi = _percentile_interval(rel, confidence)
        centre = rate_c / rate_b - 1.0
        interval = (change + lo - centre, change + hi - centre)
        notes.append(
            "one repeat per run: the interval shows request-to-request noise only; "
            "set repeats >= 2 in the spec to measure run-to-run noise"
        )
        return MetricVerdict(
            m.key,
            m.better,
            vb,
            vc,
            change,
            interval,
            decide(change, interval, m.better, threshold),
            "request-rate bootstrap",
            f"1 repeat: bootstrap {n_boot}x of the per-request rate over "
            f"{len(sb[0])} vs {len(sc[0])} requests, centred on the measured change",
            threshold,
            confidence,
            notes,
        )
    if not few:
        notes.append("one repeat and no per-request samples: the threshold alone decides")
    return MetricVerdict(
        m.key,
        m.better,
        vb,
        vc,
        change,
        None,
        decide(change, None, m.better, threshold),
        "threshold only",
        "1 repeat, too few per-request samples: noise not measured",
        threshold,
        confidence,
        notes,
    )


def _pooled_rates(side: Side, key: str) -> tuple[list[float], list[float]] | None:
    nums: list[float] = []
    dens: list[float] = []
    for detail in side.details:
        pair = rate_samples(detail, key)
        if pair is None:
            return None
        nums.extend(pair[0])
        dens.extend(pair[1])
    return (nums, dens) if len(nums) >= 2 else None


def parse_threshold(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05. ValueError with the accepted forms otherwise."""
    raw = text.strip()
    try:
        if raw.endswith("%"):
            value = float(raw[:-1]) / 100.0
        else:
            value = float(raw)
            if value >= 1:
                raise ValueError
    except ValueError:
        raise ValueError(
            f"threshold {text!r}: write a percentage (5%) or a fraction below 1 (0.05)"
        ) from None
    if not 0 <= value < 10:
        raise ValueError(f"threshold {text!r} is out of range (0% to 1000%)")
    return value
