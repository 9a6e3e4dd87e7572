"""The statistics behind the verdict (no policy here: ``servebench.verdict`` decides).

- vLLM's definitions, recomputed from the bench client's per-request arrays
  (``latency_samples``, ``rate_samples``): TTFT, TPOT, ITL and E2E per request (ITL per
  token gap), numpy's linear-interpolation percentiles (``percentile``).
- Within one run (request-to-request noise): a seeded bootstrap of a statistic
  (``bootstrap_replicates``; percentiles resampled exactly through order statistics, so a
  p99 over 100,000 token gaps costs what one over 16 requests does), of a rate
  (``ratio_replicates``), and distribution-free bounds of a percentile from the binomial
  distribution of order statistics (``quantile_bounds``).
- Across runs (run-to-run noise): Student's t (``t_quantile``), Welch's interval of the
  difference of two groups of repeats (``welch_interval``), and a t interval of the log
  ratio with the spread of a series' earlier runs (``history_interval``).
- One value's own interval, for pages (``value_interval``): cheap and deterministic.

Pure Python (stdlib only), deterministic for a seed, importable without Django.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

# Above this many resampled values per side, means and rates use the bootstrap's normal
# limit (identical in the limit, and far cheaper): exact below ~50 requests at 2,000
# resamples, where skewed latencies make the limit least trustworthy.
EXACT_BUDGET = 100_000
# A Beta(a, b) draw for an order statistic uses its normal limit when both a and b are
# at least this (the skewness of Beta(50, 50) is 0; of Beta(50, 5000), 0.28).
BETA_NORMAL = 50
TAIL_MIN = 10  # fewer samples than this beyond a percentile: order statistics, no bootstrap
MIN_SAMPLES = 10  # fewer requests than this: no bootstrap of a mean or a rate

Interval = tuple[float, float]


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


def _beta(a: float, b: float, rng: random.Random) -> float:
    """A Beta(a, b) draw: its normal limit when both are large, exact otherwise."""
    if a >= BETA_NORMAL and b >= BETA_NORMAL:
        s = a + b
        u = rng.gauss(a / s, math.sqrt(a * b / (s * s * (s + 1.0))))
        return min(1.0, max(0.0, u))
    return rng.betavariate(a, b)


def bootstrap_replicates(
    values: Sequence[float], quantile: float | None, n_boot: int, rng: random.Random
) -> list[float]:
    """``n_boot`` bootstrap replicates of the statistic of ``values``.

    Percentiles: exactly as resampling with replacement would give them, but in O(1) per
    replicate. The resample's k-th smallest value is ``x[ceil(n U) - 1]`` with U the k-th
    smallest of n uniforms, ``Beta(k, n - k + 1)`` (its normal limit when both parameters
    are large); the next one up is ``U + (1 - U) Beta(1, n - k)``, i.e.
    ``1 - (1 - U) V^(1 / (n - k))`` for a uniform V. numpy's linear interpolation needs
    those two.
    Means: real resampling while ``n * n_boot <= EXACT_BUDGET``, else the bootstrap's
    normal limit ``N(mean, s^2 / n)``.
    """
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("bootstrap of no values")
    if quantile is None:
        if n * n_boot <= EXACT_BUDGET:
            return [math.fsum(rng.choices(xs, k=n)) / n for _ in range(n_boot)]
        mean = math.fsum(xs) / n
        se = math.sqrt(variance(xs)) / math.sqrt(n) if n > 1 else 0.0
        return [rng.gauss(mean, se) for _ in range(n_boot)]
    h = (n - 1) * quantile / 100.0
    k = math.floor(h)  # 0-based: the (k+1)-th smallest, interpolated toward the (k+2)-th
    frac = h - k
    above = n - k - 1  # uniforms above the (k+1)-th smallest
    out = []
    for _ in range(n_boot):
        u = _beta(k + 1, n - k, rng)
        lo = xs[_order_index(n, u)]
        if frac > 0 and above > 0:
            u2 = 1.0 - (1.0 - u) * (1.0 - rng.random()) ** (1.0 / above)
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
    if n * n_boot <= EXACT_BUDGET:
        out = []
        pairs = list(zip(nums, dens, strict=True))
        for _ in range(n_boot):
            pick = rng.choices(pairs, k=n)
            out.append(sum([p[0] for p in pick]) / sum([p[1] for p in pick]))
        return out
    se = ratio_se(nums, dens)
    return [rng.gauss(ratio, se) for _ in range(n_boot)]


def ratio_se(nums: Sequence[float], dens: Sequence[float]) -> float:
    """The delta method's standard error of ``sum(nums) / sum(dens)``."""
    n = len(nums)
    ratio = math.fsum(nums) / math.fsum(dens)
    mean_den = math.fsum(dens) / n
    resid = [a - ratio * b for a, b in zip(nums, dens, strict=True)]
    return math.sqrt(variance(resid)) / (mean_den * math.sqrt(n))


def percentile_interval(values: list[float], confidence: float) -> Interval:
    """The central ``confidence`` range of ``values`` (bootstrap replicates); sorts them."""
    values.sort()
    alpha = 1.0 - confidence
    return (percentile(values, 100 * alpha / 2), percentile(values, 100 * (1 - alpha / 2)))


def recentre(interval: Interval, centre: float, change: float) -> Interval:
    """An interval of ``candidate / base - 1`` estimated around ``centre``, moved onto the
    measured ``change`` (multiplicatively: it stays above -100%). Infinite ends stay."""
    if centre <= -1.0:
        return interval
    factor = (1.0 + change) / (1.0 + centre)
    lo, hi = (x if math.isinf(x) else (1.0 + x) * factor - 1.0 for x in interval)
    return (lo, hi)


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


def t_pdf(t: float, df: float) -> float:
    """Student's t density."""
    log = (
        math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
        - (df + 1.0) / 2.0 * math.log1p(t * t / df)
    )  # fmt: skip
    return math.exp(log)


@functools.lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (p > 0.5): the
    Cornish-Fisher expansion refined by safeguarded Newton steps on ``t_cdf``."""
    z = statistics.NormalDist().inv_cdf(p)
    if df > 1e6:
        return z
    guess = z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
    lo, hi = 0.0, max(guess, 1.0)
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    t = min(max(guess, lo), hi)
    for _ in range(100):
        f = t_cdf(t, df) - p
        if f < 0:
            lo = t
        else:
            hi = t
        step = f / t_pdf(t, df)
        nxt = t - step
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2.0  # Newton left the bracket: bisect
        if abs(nxt - t) < 1e-12 * max(1.0, abs(t)) or hi - lo < 1e-12 * max(1.0, hi):
            return nxt
        t = nxt
    return t


def variance(values: Sequence[float]) -> float:
    """The sample variance in plain float arithmetic (``statistics.variance`` works in
    exact fractions: ~50x slower, and a verdict page computes thousands)."""
    n = len(values)
    mean = math.fsum(values) / n
    return math.fsum((v - mean) ** 2 for v in values) / (n - 1)


def welch_interval(
    base: Sequence[float], cand: Sequence[float], confidence: float
) -> Interval | None:
    """Interval of ``mean(cand) / mean(base) - 1`` from the spread across repeats: Welch's
    t when both sides have two or more values; a t interval with the known side's spread
    (assumed equal) when only one does; None when neither does."""
    nb, nc = len(base), len(cand)
    if nb == 0 or nc == 0 or (nb < 2 and nc < 2):
        return None
    mb, mc = math.fsum(base) / nb, math.fsum(cand) / nc
    if mb == 0:
        return None
    if nb >= 2 and nc >= 2:
        vb, vc = variance(base), variance(cand)
        se2 = vb / nb + vc / nc
        num = se2**2
        den = (vb / nb) ** 2 / (nb - 1) + (vc / nc) ** 2 / (nc - 1)
        df = num / den if den > 0 else float(nb + nc - 2)
    else:
        known = base if nb >= 2 else cand
        v = variance(known)
        se2 = v * (1.0 / nb + 1.0 / nc)
        df = float(len(known) - 1)
    se = math.sqrt(se2)
    t = t_quantile(1.0 - (1.0 - confidence) / 2.0, max(df, 1.0))
    diff = mc - mb
    # Metrics are positive, so candidate / base - 1 > -100% whatever the normal theory says.
    return (max((diff - t * se) / mb, -1.0), (diff + t * se) / mb)


def history_interval(
    history: Sequence[float], base: float, cand: float, confidence: float
) -> Interval | None:
    """Interval of ``cand / base - 1`` when each side is one run of a series whose earlier
    runs gave ``history`` (one value per run): a t interval of ``ln(cand / base)`` with
    the standard deviation of ``ln(history)`` for each side (``sqrt(2) s``) and
    ``len(history) - 1`` degrees of freedom, as a prediction interval for the difference
    of two new runs of the series. None with fewer than two positive values."""
    logs = [math.log(h) for h in history if h > 0]
    if len(logs) < 2 or base <= 0 or cand <= 0:
        return None
    s = math.sqrt(variance(logs))
    t = t_quantile(1.0 - (1.0 - confidence) / 2.0, float(len(logs) - 1))
    d = math.log(cand / base)
    half = t * s * math.sqrt(2.0)
    return (math.exp(d - half) - 1.0, math.exp(d + half) - 1.0)


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
) -> Interval:
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


# --------------------------------------------------------------------------- one value


def _order_bounds_fast(
    xs: Sequence[float], quantile: float, confidence: float
) -> tuple[float | None, float | None]:
    """``quantile_bounds`` at ``confidence`` (both ends together), with the binomial's
    normal limit for large samples (exact below 2,000)."""
    n = len(xs)
    if n < 2000:
        return quantile_bounds(xs, quantile, confidence)
    p = quantile / 100.0
    z = statistics.NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
    half = z * math.sqrt(n * p * (1.0 - p))
    lo, hi = math.floor(n * p - half), math.ceil(n * p + half) + 1
    return (xs[lo - 1] if lo >= 1 else None, xs[hi - 1] if hi <= n else None)


def value_interval(
    samples: Sequence[float], quantile: float | None, confidence: float
) -> tuple[Interval, str] | None:
    """One run's own ``confidence`` interval of a latency statistic from its samples, for
    pages: distribution-free order-statistic bounds for a percentile (an unbounded end is
    infinite), a t interval for a mean. (interval, method) or None without samples."""
    n = len(samples)
    if n == 0:
        return None
    if quantile is not None:
        lo, hi = _order_bounds_fast(sorted(samples), quantile, confidence)
        return (
            (lo if lo is not None else -math.inf, hi if hi is not None else math.inf),
            "order statistics",
        )
    if n < 2:
        return None
    mean = math.fsum(samples) / n
    half = t_quantile(1.0 - (1.0 - confidence) / 2.0, n - 1) * math.sqrt(variance(samples))
    half /= math.sqrt(n)
    return (mean - half, mean + half), "t interval"


def rate_interval(
    nums: Sequence[float], dens: Sequence[float], value: float, confidence: float
) -> tuple[Interval, str] | None:
    """One run's request-level interval of a throughput ``value``: the delta method's
    relative standard error of the per-request rate, applied to the reported value."""
    if len(nums) < MIN_SAMPLES:
        return None
    ratio = math.fsum(nums) / math.fsum(dens)
    rel = ratio_se(nums, dens) / ratio
    z = statistics.NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
    return (value * max(0.0, 1.0 - z * rel), value * (1.0 + z * rel)), "request-level"
