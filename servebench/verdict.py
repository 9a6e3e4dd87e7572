"""The one verdict engine: did a metric change by more than the threshold *and* by more
than the run-to-run noise? The compare page, the API, the re-run "reproduced?" banner and
``servebench compare`` all call ``compare_metric``; the statistics are in
``servebench.stats``.

A gate that is red on an unchanged commit gets switched off; one that passes a 20%
regression because "benchmarks are noisy" is worse. The rules, per metric of a point:

1. **not comparable**: the runs measured different things (``runners.fingerprint``: a
   different workload, sweep points or GPU), so no change between them is judged. A
   different configuration (model, engine flags, versions) is what is judged.
2. **no data**: the metric is missing on a side (or the base is zero).
3. **within threshold**: ``|candidate / base - 1|`` is at most the threshold (5% by
   default): too small to matter, whatever the noise.
4. Beyond the threshold, the change is judged against the *run-to-run* noise, which
   only two sources measure:

   - **repeats** (``repeats: 2`` or more in the spec): Welch's t interval of the
     difference of the repeat means (a t interval with the known side's spread when only
     one side has repeats);
   - **history**: at least ``MIN_HISTORY`` earlier succeeded runs of the base's series
     (same fingerprint, same owner, created before the candidate; the newest
     ``LOOKBACK``), one value each: a t interval of ``ln(candidate / base)`` with the
     spread of ``ln`` of those values (``sqrt(2)`` of it: both sides are one run each),
     ``runs - 1`` degrees of freedom.

   When the run-to-run interval excludes zero, the within-run (request-to-request)
   interval is computed too (``request_interval``), from the bench client's per-request
   samples: a seeded bootstrap for latency statistics (order statistics for a percentile
   with fewer than ``TAIL_MIN`` samples beyond it, a t interval for a mean of fewer than
   ``MIN_SAMPLES`` requests), a bootstrap of the per-request rate for throughput; the
   verdict's interval keeps the wider end of each. Every interval is centred on the
   measured change.

   - **worse** / **better**: the interval excludes zero (direction-aware: throughput
     higher is better, latency lower). Only ``worse`` fails a build.
   - **within noise**: the interval contains zero: the data cannot tell the runs apart.
   - **noise not measured**: neither repeats nor history exist. Requests of one run
     cannot see run-to-run noise (the same spec run twice on a shared box differed by 44%
     at one point, and request-level intervals called it "9 regressions"), so this never
     fails a build; it says what to add (repeats, or earlier runs of the series).

The value compared is the mean over a run's repeats of the number the bench client
reported (what every page shows); a statistic the client did not report is recomputed
from its samples. Deterministic for a seed; pure Python (stdlib), importable without
Django.
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from runners.choices import choice_message
from servebench.stats import (
    MIN_SAMPLES,
    TAIL_MIN,
    Interval,
    bootstrap_replicates,
    history_interval,
    latency_samples,
    order_statistic_interval,
    percentile,
    percentile_interval,
    quantile_bounds,
    rate_samples,
    ratio_replicates,
    recentre,
    samples_for_bounds,
    statistic,
    t_quantile,
    tail_count,
    welch_interval,
)

__all__ = [
    "BETTER",
    "NOISE",
    "NOT_COMPARABLE",
    "NO_DATA",
    "THRESHOLD",
    "UNMEASURED",
    "VERDICTS",
    "WORSE",
    "Assessment",
    "Metric",
    "MetricVerdict",
    "Side",
    "assess",
    "bootstrap_replicates",
    "compare_metric",
    "decide",
    "judged_metric",
    "latency_samples",
    "parse_metric",
    "parse_threshold",
    "percentile",
    "quantile_bounds",
    "request_interval",
    "statistic",
    "t_quantile",
]

BETTER = "better"
WORSE = "worse"
NOISE = "within noise"
THRESHOLD = "within threshold"
UNMEASURED = "noise not measured"
NO_DATA = "no data"
NOT_COMPARABLE = "not comparable"
VERDICTS = (WORSE, BETTER, UNMEASURED, NOISE, THRESHOLD, NO_DATA, NOT_COMPARABLE)
# What a page may colour: the only two verdicts that claim a change beyond the noise.
COLOURED = (BETTER, WORSE)

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
MIN_HISTORY = 3  # earlier runs of the series needed before their spread counts as noise
LOOKBACK = 20  # the newest earlier runs of the series that history uses

THROUGHPUT_METRICS = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
)
# Answers and speculation (runners.traffic.correctness, the server's /metrics): shares and
# lengths where higher is better; absent unless the spec checks correctness or the server
# speculates.
QUALITY_METRICS = (
    "greedy_agreement",
    "exact_match_rate",
    "eval_accuracy",
    "spec_decode_acceptance_rate",
    "spec_decode_mean_accepted_length",
)
# Energy and cost per output token (runners.telemetry: the GPUs' energy over the requests,
# priced per GPU-hour): lower is better; absent where the GPUs could not be read (no NVML).
ENERGY_METRICS = {
    "energy_per_output_token_j": "not measured (no NVML): energy needs NVIDIA GPU telemetry",
    "cost_per_million_output_tokens": (
        "not measured: cost needs a GPU-hour price and the run's GPUs (no NVML on a CPU)"
    ),
}
LATENCY_NAMES = ("ttft", "tpot", "itl", "e2el")
_LATENCY_RE = re.compile(r"^(mean|median|p\d{1,2}(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms\Z")

Better = Literal["higher", "lower"]


# --------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class Metric:
    """A metric the verdict knows: vLLM's key, which direction is better, how to sample it."""

    key: str
    better: Better
    latency: str | None = None  # ttft / tpot / itl / e2el
    quantile: float | None = None  # 0..100; None = the mean
    missing: str = ""  # why it can be absent, said with "no data" (ENERGY_METRICS)

    @property
    def is_latency(self) -> bool:
        return self.latency is not None


def parse_metric(name: str) -> Metric:
    """``output_throughput``, ``p99_ttft_ms``, ``median_itl_ms``, ``mean_e2el_ms``, ``p95_tpot_ms``;
    ``p50_*`` is vLLM's ``median_*``. ValueError naming the known forms otherwise."""
    key = name.strip()
    if key in THROUGHPUT_METRICS or key in QUALITY_METRICS:
        return Metric(key, "higher")
    if key in ENERGY_METRICS:
        return Metric(key, "lower", missing=ENERGY_METRICS[key])
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
    named = (*THROUGHPUT_METRICS, *QUALITY_METRICS, *ENERGY_METRICS, "p99_ttft_ms", "mean_tpot_ms")
    raise ValueError(
        f"{choice_message(name, named, 'metric')}, or any "
        "<stat>_<ttft|tpot|itl|e2el>_ms with stat mean, median, p50, p90, p99 (any pNN)"
    )


@functools.lru_cache(maxsize=512)
def judged_metric(name: str) -> Metric | None:
    """The metric if the engine judges it (throughput, latency statistics, energy and cost
    per token), else None (preemptions, KV-cache usage, power...: facts a page shows
    without a verdict). Remembered per name (a ``Metric`` is frozen): a comparison asks
    for every row, and a name it does not judge costs a "did you mean" search."""
    try:
        return parse_metric(name)
    except ValueError:
        return None


# --------------------------------------------------------------------------- one side


@dataclass
class Side:
    """One run's repeats of one point: the reported metrics (one mapping per repeat) and
    the per-request arrays (``details``, one per repeat; None when not loaded)."""

    metrics: list[Mapping[str, Any]] = field(default_factory=list)
    details: list[Mapping[str, Any]] | None = None
    # reported() per (metric key, repeats): a verdict asks for each metric twice
    # (assess's short check, then per_repeat); a repeat appended later makes a new key.
    _reported: dict[tuple[str, int], list[float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def repeats(self) -> int:
        return len(self.metrics)

    def reported(self, metric: Metric) -> list[float]:
        """The per-repeat values the client reported (``median`` read as ``p50`` too)."""
        memo = (metric.key, len(self.metrics))
        found = self._reported.get(memo)
        if found is None:
            found = [v for m in self.metrics if (v := _reported(m, metric.key)) is not None]
            self._reported[memo] = found
        return list(found)

    def per_repeat(self, metric: Metric) -> list[float]:
        """One value per repeat: as reported when every repeat reported it, else
        recomputed from each repeat's samples (latency statistics only)."""
        reported = self.reported(metric)
        if len(reported) == self.repeats or metric.latency is None or not self.details:
            return reported
        values = [latency_samples(d, metric.latency) for d in self.details]
        if len(values) == self.repeats and all(values):
            return [statistic(x, metric.quantile) for x in values]
        return reported

    def pooled_latency(self, metric: Metric) -> list[float]:
        assert metric.latency is not None
        out: list[float] = []
        for detail in self.details or []:
            out.extend(latency_samples(detail, metric.latency))
        return out

    def pooled_rates(self, key: str) -> tuple[list[float], list[float]] | None:
        nums: list[float] = []
        dens: list[float] = []
        for detail in self.details or []:
            pair = rate_samples(detail, key)
            if pair is None:
                return None
            nums.extend(pair[0])
            dens.extend(pair[1])
        return (nums, dens) if len(nums) >= 2 else None


def _reported(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if value is None and key.startswith("median_"):
        value = metrics.get("p50_" + key[len("median_") :])
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


# --------------------------------------------------------------------------- verdicts


@dataclass
class MetricVerdict:
    """One metric of one point: the numbers, the interval, where the noise came from, the
    verdict and why.

    ``change`` and ``interval`` are ``candidate / base - 1`` (0.1 = 10% higher), whatever
    the direction; ``better`` says which direction is good. ``noise`` names the
    run-to-run sources (``repeats``, ``history``, both, or ``not measured``); ``method``
    every source of the interval.
    """

    metric: str
    better: Better
    base: float | None
    candidate: float | None
    change: float | None
    interval: Interval | None
    verdict: str
    method: str
    detail: str
    threshold: float
    confidence: float
    notes: list[str] = field(default_factory=list)
    noise: str = "not measured"
    history_runs: int = 0

    @property
    def regressed(self) -> bool:
        return self.verdict == WORSE

    @property
    def coloured(self) -> str:
        """``better`` / ``worse`` where a page may colour the change, else ""."""
        return self.verdict if self.verdict in COLOURED else ""

    def brief(self) -> dict[str, Any]:
        """The verdict without its numbers' sources and rules: what a table lists per
        cell (the portal's compare API; ``as_dict`` is the long form)."""
        return {
            "metric": self.metric,
            "verdict": self.verdict,
            "change": self.change,
            "interval": self._interval_json(),
            "noise": self.noise,
            "history_runs": self.history_runs,
            "method": self.method,
        }

    def _interval_json(self) -> list[float | None] | None:
        # JSON has no infinity: an unbounded end is null
        return [None if math.isinf(x) else x for x in self.interval] if self.interval else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "better": self.better,
            "base": self.base,
            "candidate": self.candidate,
            "change": self.change,
            "interval": self._interval_json(),
            "confidence": self.confidence,
            "threshold": self.threshold,
            "verdict": self.verdict,
            "noise": self.noise,
            "history_runs": self.history_runs,
            "method": self.method,
            "detail": self.detail,
            "notes": list(self.notes),
        }


def decide(
    change: float,
    noise: Interval | None,
    requests: Interval | None,
    better: Better,
    threshold: float,
) -> str:
    """The verdict from the relative change, the run-to-run interval (``noise``: repeats
    or history, None when not measured), the request-level interval (``requests``, None
    without samples: it can only widen ``noise``), the good direction and the threshold
    (0.05 = 5%)."""
    sign = 1.0 if better == "higher" else -1.0
    gain = sign * change  # > 0: an improvement
    if abs(gain) <= threshold:
        return THRESHOLD
    if noise is None:
        return UNMEASURED
    lo, hi = _widest(noise, requests)
    if lo <= 0.0 <= hi:
        return NOISE
    return BETTER if gain > 0 else WORSE


def _widest(*intervals: Interval | None) -> Interval:
    present = [i for i in intervals if i is not None]
    return (min(i[0] for i in present), max(i[1] for i in present))


@dataclass(slots=True)
class Assessment:
    """The run-to-run part of one metric's verdict (``assess``): the values, the change
    and its run-to-run interval. ``needs_samples`` says whether per-request samples
    could change the verdict, and ``compare_metric(assessed=...)`` concludes from it: a
    caller that loads samples only where they matter (a comparison of stored runs)
    computes this once per cell."""

    metric: Metric
    base: float | None
    candidate: float | None
    comparable: bool
    short: bool  # a latency statistic some repeat did not report: recomputed from samples
    change: float | None = None
    noise: Interval | None = None
    history_runs: int = 0
    methods: list[str] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)

    def needs_samples(self, threshold: float = DEFAULT_THRESHOLD) -> bool:
        """Whether ``compare_metric`` would read per-request samples: for a comparable
        change beyond the threshold whose run-to-run interval excludes zero, or a latency
        statistic some repeat did not report (callers that store samples elsewhere load
        them for those cells alone)."""
        if not self.comparable:
            return False
        if self.short:
            return True
        if self.change is None:
            return False
        return _needs_requests(self.change, self.noise, self.metric.better, threshold)


def assess(
    metric: Metric | str,
    base: Side,
    cand: Side,
    *,
    history: Sequence[float] | None = None,
    comparable: bool = True,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Assessment:
    """The run-to-run part of ``compare_metric``'s verdict (``Assessment``)."""
    m = parse_metric(metric) if isinstance(metric, str) else metric
    short = m.latency is not None and (
        len(base.reported(m)) != base.repeats or len(cand.reported(m)) != cand.repeats
    )
    rb, rc = base.per_repeat(m), cand.per_repeat(m)
    vb = math.fsum(rb) / len(rb) if rb else None  # statistics.fmean's arithmetic
    vc = math.fsum(rc) / len(rc) if rc else None
    found = Assessment(m, vb, vc, comparable, short)
    if vb is None or vc is None or vb == 0:
        return found
    found.change = vc / vb - 1.0
    if comparable:
        found.noise, found.history_runs = _run_to_run(
            rb, rc, vb, vc, history, confidence, found.methods, found.parts
        )
    return found


def compare_metric(
    metric: Metric | str,
    base: Side,
    cand: Side,
    *,
    history: Sequence[float] | None = None,
    comparable: bool = True,
    threshold: float = DEFAULT_THRESHOLD,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int | str = 0,
    assessed: Assessment | None = None,
) -> MetricVerdict:
    """The verdict on one metric between two runs' repeats of one point (module doc).

    ``history``: one value per earlier run of the base's series (oldest first), used
    when it has at least ``MIN_HISTORY``. ``comparable``: whether the fingerprints agree.
    ``assessed``: this cell's ``assess`` with the same arguments, when the caller has it
    and no samples were loaded since (``needs_samples`` was false). Deterministic: the
    bootstrap's generator is seeded with ``seed`` and the metric key.
    """
    a = assessed or assess(
        metric, base, cand, history=history, comparable=comparable, confidence=confidence
    )
    m, vb, vc, change = a.metric, a.base, a.candidate, a.change
    common: dict[str, Any] = {"threshold": threshold, "confidence": confidence}
    if vb is None or vc is None or change is None:
        why = "base is zero" if vb == 0 else "missing on a side"
        missing = [f"{m.key}: {m.missing}"] if m.missing and vb != 0 else []
        return MetricVerdict(
            m.key, m.better, vb, vc, None, None, NO_DATA, "-", why, notes=missing, **common
        )
    if not a.comparable:
        return MetricVerdict(
            m.key, m.better, vb, vc, change, None, NOT_COMPARABLE, "-",
            "the runs measured different workloads or hardware", **common,
        )  # fmt: skip
    notes: list[str] = []
    methods, parts, noise = list(a.methods), list(a.parts), a.noise
    sources = " + ".join(methods) if methods else "not measured"
    requests = None
    if _needs_requests(change, noise, m.better, threshold):
        requests = request_interval(
            m, base, cand, change, confidence=confidence, n_boot=n_boot, seed=seed,
            notes=notes, parts=parts,
        )  # fmt: skip
        if requests is not None:
            methods.append(requests[1])
            notes.append("interval: the wider ends of the run-to-run and the request-level ones")
    verdict = decide(change, noise, requests[0] if requests else None, m.better, threshold)
    interval = noise if requests is None else _widest(noise, requests[0])
    if verdict == UNMEASURED:
        notes.append(
            "one repeat and no history of this series: the run-to-run noise was not "
            "measured, so this change cannot fail a build (requests of one run cannot see "
            "it); set repeats >= 2 in the spec, or let the series build a history of "
            f"{MIN_HISTORY}+ succeeded runs"
        )
    if not parts:
        parts.append(
            f"the change is within the {threshold * 100:g}% threshold"
            if verdict == THRESHOLD
            else "no repeats and no history: the run-to-run noise is unknown"
        )
    return MetricVerdict(
        m.key, m.better, vb, vc, change, interval, verdict, " + ".join(methods) or "-",
        "; ".join(parts), notes=notes, noise=sources, history_runs=a.history_runs, **common,
    )  # fmt: skip


def _needs_requests(change: float, noise: Interval | None, better: Better, thr: float) -> bool:
    """Whether the request-level interval could change the verdict: only for a change
    beyond the threshold whose run-to-run interval excludes zero (it can only widen it)."""
    sign = 1.0 if better == "higher" else -1.0
    return abs(sign * change) > thr and noise is not None and not noise[0] <= 0.0 <= noise[1]


def request_interval(
    metric: Metric | str,
    base: Side,
    cand: Side,
    change: float,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int | str = 0,
    notes: list[str] | None = None,
    parts: list[str] | None = None,
) -> tuple[Interval, str] | None:
    """The request-level (within-run) interval of ``change`` from both sides' per-request
    samples, and its method; None without samples. It sees request-to-request noise only,
    so the verdict uses it to widen a run-to-run interval, never on its own."""
    m = parse_metric(metric) if isinstance(metric, str) else metric
    rng = random.Random(f"{seed}|{m.key}")  # noqa: S311 - statistics, not secrets
    notes = notes if notes is not None else []
    parts = parts if parts is not None else []
    if m.is_latency:
        return _latency_requests(m, base, cand, change, confidence, n_boot, rng, notes, parts)
    return _rate_requests(m, base, cand, change, confidence, n_boot, rng, notes, parts)


def _run_to_run(
    rb: list[float],
    rc: list[float],
    vb: float,
    vc: float,
    history: Sequence[float] | None,
    confidence: float,
    methods: list[str],
    parts: list[str],
) -> tuple[Interval | None, int]:
    """The run-to-run interval from repeats and history (the wider ends of both), and
    how many earlier runs it used."""
    found: list[Interval] = []
    welch = welch_interval(rb, rc, confidence)
    if welch is not None:
        found.append(welch)
        methods.append("repeats")
        if len(rb) >= 2 and len(rc) >= 2:
            parts.append(f"Welch t over {len(rb)} vs {len(rc)} repeats")
        else:
            known = "base" if len(rb) >= 2 else "candidate"
            parts.append(
                f"t interval with the {known}'s spread over {max(len(rb), len(rc))} repeats "
                "(the other side has 1)"
            )
    values = [h for h in history or [] if h is not None and h > 0]
    used = 0
    if len(values) >= MIN_HISTORY:
        hist = history_interval(values, vb, vc, confidence)
        if hist is not None:
            found.append(hist)
            used = len(values)
            methods.append("history")
            parts.append(
                f"t interval of the log ratio with the spread of {used} earlier runs of the series"
            )
    return (_widest(*found) if found else None), used


def _latency_requests(
    m: Metric,
    base: Side,
    cand: Side,
    change: float,
    confidence: float,
    n_boot: int,
    rng: random.Random,
    notes: list[str],
    parts: list[str],
) -> tuple[Interval, str] | None:
    """The request-level interval of a latency statistic, centred on ``change``."""
    xb, xc = base.pooled_latency(m), cand.pooled_latency(m)
    if not xb or not xc or statistic(xb, m.quantile) <= 0:
        return None  # no samples, or a zero statistic (tokens streamed in one chunk)
    centre = statistic(xc, m.quantile) / statistic(xb, m.quantile) - 1.0
    unit = "token gaps" if m.latency == "itl" else "requests"
    q = m.quantile
    if q is not None and min(tail_count(len(xb), q), tail_count(len(xc), q)) < TAIL_MIN:
        interval = order_statistic_interval(xb, xc, q, confidence)
        parts.append(
            f"distribution-free interval of each run's p{q:g} from its order statistics "
            f"({len(xb)} vs {len(xc)} {unit}; fewer than {TAIL_MIN} lie beyond it, where a "
            "bootstrap is overconfident)"
        )
        if math.isinf(interval[0]) or math.isinf(interval[1]):
            need = samples_for_bounds(q, confidence)
            notes.append(
                f"p{q:g} needs at least {need} {unit} per run for a bounded interval; with "
                "fewer it cannot fail a build on noise grounds: raise num_prompts"
            )
        return recentre(interval, centre, change), "order statistics"
    if q is None and min(len(xb), len(xc)) < MIN_SAMPLES:
        interval = welch_interval(xb, xc, confidence)
        if interval is None:
            return None
        parts.append(f"Welch t over {len(xb)} vs {len(xc)} {unit} (too few for a bootstrap)")
        return recentre(interval, centre, change), "t interval"
    boot_b = bootstrap_replicates(xb, q, n_boot, rng)
    boot_c = bootstrap_replicates(xc, q, n_boot, rng)
    rel = [c / b - 1.0 for b, c in zip(boot_b, boot_c, strict=True) if b > 0]
    if len(rel) < n_boot / 2:
        return None  # the base's statistic is mostly zero: no ratio to resample
    parts.append(f"bootstrap {n_boot}x over {len(xb)} vs {len(xc)} {unit}")
    return recentre(percentile_interval(rel, confidence), centre, change), "bootstrap"


def _rate_requests(
    m: Metric,
    base: Side,
    cand: Side,
    change: float,
    confidence: float,
    n_boot: int,
    rng: random.Random,
    notes: list[str],
    parts: list[str],
) -> tuple[Interval, str] | None:
    """The request-level interval of a throughput (the per-request rate's bootstrap),
    centred on ``change``: it sees request-to-request noise only."""
    sb, sc = base.pooled_rates(m.key), cand.pooled_rates(m.key)
    if sb is None or sc is None:
        return None
    if min(len(sb[0]), len(sc[0])) < MIN_SAMPLES:
        notes.append(
            f"only {min(len(sb[0]), len(sc[0]))} requests: too few to bootstrap the "
            "per-request rate"
        )
        return None
    rate_b = math.fsum(sb[0]) / math.fsum(sb[1])
    rate_c = math.fsum(sc[0]) / math.fsum(sc[1])
    boot_b = ratio_replicates(sb[0], sb[1], n_boot, rng)
    boot_c = ratio_replicates(sc[0], sc[1], n_boot, rng)
    rel = [c / b - 1.0 for b, c in zip(boot_b, boot_c, strict=True) if b > 0]
    parts.append(
        f"bootstrap {n_boot}x of the per-request rate over {len(sb[0])} vs {len(sc[0])} "
        "requests (request-to-request noise only)"
    )
    interval = percentile_interval(rel, confidence)
    return recentre(interval, rate_c / rate_b - 1.0, change), "request-rate bootstrap"


# --------------------------------------------------------------------------- options


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
