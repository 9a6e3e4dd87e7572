"""A run's measurements per sweep point: repeats aggregated, metrics named once.

Every page and API answer that shows numbers per point (the run page, compare, history,
CSV downloads) reads them through here, so "p50", "goodput" or "peak KV-cache usage"
mean the same thing everywhere.

- ``METRICS``: the metric catalogue (key, label, unit, which direction is better). Keys
  are vLLM's bench names (``output_throughput``, ``p99_ttft_ms``...), plus the server's
  (``preemptions``, ``kv_cache_usage_peak``...), ``request_goodput`` and
  ``slo_attainment``. ``p50_*`` is vLLM's ``median_*`` when the client gave no p50.
- ``measurement_values(m)``: one measurement's numbers under those keys.
- ``aggregate(measurements)``: ``PointStats`` per (backend, point): mean, sample standard
  deviation, min and max across the succeeded repeats, failures counted.
- ``RunResults``: a run's points; ``portal.benchmarks.runview.load`` builds it with the
  rest of the run, in one query (two when the spec has an SLO and the client reported no
  goodput: the per-request arrays it needs).
- ``PointStats.uncertainty(key)``: how well a number is known: a t interval over the
  repeats, or for a point measured once its request-level interval
  (``attach_request_intervals``: one query, samples through ``portal.benchmarks.samples``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from portal.benchmarks import goodput, samples
from portal.benchmarks.models import Measurement
from runners import bottleneck as bn
from runners import sla
from runners import spec as rs
from servebench import stats
from servebench.verdict import judged_metric


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    better: str = ""  # "higher", "lower" or "" (neither: a fact, not a score)
    digits: int = 1
    group: str = ""


def _latency_metrics() -> list[Metric]:
    names = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E"}
    out = []
    for key, name in names.items():
        digits = 2 if key in ("tpot", "itl") else 1
        for stat in ("mean", "p50", "p90", "p99"):
            out.append(Metric(f"{stat}_{key}_ms", f"{name} {stat}", "ms", "lower", digits, key))
    return out


METRICS: tuple[Metric, ...] = (
    Metric("request_throughput", "Requests/s", "req/s", "higher", 2, "throughput"),
    Metric("output_throughput", "Output tok/s", "tok/s", "higher", 1, "throughput"),
    Metric("total_token_throughput", "Total tok/s", "tok/s", "higher", 1, "throughput"),
    Metric("request_goodput", "Goodput", "req/s", "higher", 2, "goodput"),
    Metric("slo_attainment", "Within SLO", "%", "higher", 1, "goodput"),
    *_latency_metrics(),
    Metric("preemptions", "Preemptions", "", "lower", 0, "server"),
    Metric("kv_cache_usage_peak", "Peak KV cache", "%", "", 1, "server"),
    Metric("gpu_memory_peak_bytes", "Peak GPU memory", "GiB", "", 2, "server"),
    Metric("prefix_cache_hit_rate", "Prefix-cache hits", "%", "", 1, "server"),
    # Answers under load (runners.traffic.correctness) and speculative decoding (/metrics).
    Metric("greedy_agreement", "Greedy agreement", "%", "higher", 1, "correctness"),
    Metric("exact_match_rate", "Exact answers", "%", "higher", 1, "correctness"),
    Metric("eval_accuracy", "Eval accuracy", "%", "higher", 1, "correctness"),
    Metric("spec_decode_acceptance_rate", "Draft acceptance", "%", "higher", 1, "speculative"),
    Metric(
        "spec_decode_mean_accepted_length",
        "Mean accepted length",
        "tok",
        "higher",
        2,
        "speculative",
    ),
    # Energy and cost (runners.telemetry, priced by portal.benchmarks.energy): NVML only.
    Metric("energy_per_output_token_j", "Energy per output token", "J", "lower", 4, "energy"),
    Metric("avg_power_w", "Mean GPU power", "W", "", 0, "energy"),
    Metric("gpu_util", "GPU utilisation", "%", "", 0, "energy"),
    Metric(
        "cost_per_million_output_tokens",
        "Cost per 1M output tokens",
        settings.SERVEBENCH_PRICE_CURRENCY,
        "lower",
        3,
        "energy",
    ),
)
METRIC_BY_KEY: dict[str, Metric] = {m.key: m for m in METRICS}

# Server facts kept in columns (the runner sends them in server_metrics).
SERVER_COLUMNS = (
    "preemptions",
    "kv_cache_usage_peak",
    "gpu_memory_peak_bytes",
    "prefix_cache_hit_rate",
)
# Server facts read from the stored server_metrics (no column: no page sorts by them).
SERVER_FACTS = ("num_requests_running_mean",)
_LATENCY = ("ttft", "tpot", "itl", "e2el")


def display_value(key: str, value: float | None) -> float | None:
    """A metric in the unit its catalogue entry names (fractions as %, bytes as GiB)."""
    if value is None:
        return None
    metric = METRIC_BY_KEY.get(key)
    if metric is None:
        return value
    if metric.unit == "%":
        return value * 100.0
    if metric.unit == "GiB":
        return value / 2**30
    return value


def measurement_values(
    m: Measurement, extra: Mapping[str, float] | None = None
) -> dict[str, float]:
    """One succeeded measurement's numbers under the catalogue's keys."""
    values: dict[str, float] = {}
    for key, value in (m.metrics or {}).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            values[key] = float(value)
    for name in _LATENCY:
        median = values.get(f"median_{name}_ms")
        if median is not None:
            values.setdefault(f"p50_{name}_ms", median)
    for column in SERVER_COLUMNS:
        value = getattr(m, column, None)
        if value is not None:
            values[column] = float(value)
    server = {} if "server_metrics" in deferred_fields(m) else m.server_metrics or {}
    for key in SERVER_FACTS:
        value = server.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            values[key] = float(value)
    if extra:
        values.update(extra)
    return values


@dataclass(frozen=True)
class Uncertainty:
    """A value and its 95% interval: over ``repeats`` (``method`` "repeats": run-to-run
    spread) or over the requests of one repeat (request-level; ``samples`` requests, a
    random subset of ``of`` for a point too large to travel inline:
    ``runners.samplesfile``)."""

    value: float
    low: float
    high: float
    method: str
    repeats: int
    samples: int
    of: int = 0  # the point's requests when ``samples`` are a reading sample of them

    @property
    def relative(self) -> float:
        """The interval's larger half-width as a fraction of the value (inf: unbounded)."""
        if not self.value:
            return math.inf
        return max(self.high - self.value, self.value - self.low) / abs(self.value)

    @property
    def request_level(self) -> bool:
        return self.method != "repeats"

    def describe(self) -> str:
        """'±3.1% (95% interval over 3 repeats)' / '... of 32 requests, 1 repeat' ."""
        spread = "unbounded" if math.isinf(self.relative) else f"±{self.relative:.1%}"
        if self.request_level:
            which = (
                f"a random {self.samples:,} of its {self.of:,} requests"
                if self.of > self.samples
                else f"{self.samples} requests"
            )
            return f"{spread} (95% request-level interval, {which}, 1 repeat)"
        return f"{spread} (95% interval over {self.repeats} repeats)"


@dataclass
class PointStats:
    """One backend at one sweep point, its repeats aggregated."""

    backend: str
    backend_kind: str
    point_key: str
    sweep: str
    axis: str | None
    value: float | None
    input_len: int
    output_len: int
    concurrency: int
    num_prompts: int
    repeats: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    mean: dict[str, float] = field(default_factory=dict)
    std: dict[str, float] = field(default_factory=dict)
    low: dict[str, float] = field(default_factory=dict)
    high: dict[str, float] = field(default_factory=dict)
    # One repeat: each metric's request-level 95% interval (``attach_request_intervals``).
    requests: dict[str, Uncertainty] = field(default_factory=dict)
    samples: int = 0  # requests per repeat, when the per-request samples were read
    ids: list[int] = field(default_factory=list)  # the succeeded measurements' ids
    # Each repeat's facts as ``runners.bottleneck.diagnose`` reads them (``bottleneck_facts``),
    # failed repeats included; and the decode roofline fraction where the capacity panel
    # computed one (GPU runs of a known GPU: ``attach_roofline``).
    facts: list[dict[str, Any]] = field(default_factory=list)
    roofline_fraction: float | None = None

    @property
    def bottleneck(self) -> bn.Bottleneck | None:
        """What limited the point over its repeats (``runners.bottleneck.combine``):
        succeeded repeats decide when there are any."""
        found = [bn.diagnose(f, roofline_fraction=self.roofline_fraction) for f in self.facts]
        ok = [b for b in found if b.cause not in ("errors", "network")]
        return bn.combine(ok if self.repeats and ok else found)

    def uncertainty(self, key: str) -> Uncertainty | None:
        """How well ``key`` is known: a t interval over the repeats when there are
        several (run-to-run spread), else the request-level interval, else None."""
        mean = self.mean.get(key)
        if mean is None:
            return None
        if self.repeats > 1 and key in self.std:
            half = stats.t_quantile(0.975, self.repeats - 1) * self.std[key]
            half /= math.sqrt(self.repeats)
            return Uncertainty(mean, mean - half, mean + half, "repeats", self.repeats, 0)
        return self.requests.get(key)

    @property
    def x(self) -> float:
        """Where the point sits on its sweep's axis (a point without a sweep sits at 1)."""
        return float(self.value) if self.value is not None else 1.0

    @property
    def ok(self) -> bool:
        return self.repeats > 0

    def get(self, key: str) -> float | None:
        return self.mean.get(key)

    @property
    def label(self) -> str:
        if self.axis is None or self.value is None:
            return self.sweep
        return f"{self.axis}={number(self.value)}"

    @property
    def short(self) -> str:
        """'concurrency 16', 'prompt 1024 tokens' ... for sentences and headings."""
        if self.axis is None or self.value is None:
            return self.sweep
        words = AXIS_WORDS.get(self.axis)  # stored text is never a format string
        return words.format(number(self.value)) if words else f"{self.axis} {number(self.value)}"


AXIS_WORDS = {
    "max_concurrency": "concurrency {}",
    "input_len": "prompt {} tokens",
    "output_len": "output {} tokens",
    "request_rate": "{} req/s",
    "num_prompts": "{} prompts",
}


def number(value: float | None) -> str:
    """16.0 -> '16', 0.5 -> '0.5' (sweep values, labels)."""
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass
class Series:
    """One backend along one sweep: succeeded points sorted by the swept value."""

    backend: str
    sweep: str
    axis: str
    points: list[PointStats]

    def xs(self) -> list[float]:
        return [p.x for p in self.points]

    def ys(self, key: str) -> list[float | None]:
        return [p.mean.get(key) for p in self.points]

    def errs(self, key: str) -> list[float]:
        return [p.std.get(key, 0.0) for p in self.points]

    def has(self, key: str) -> bool:
        return any(p.mean.get(key) is not None for p in self.points)


# Baselines measured once, at their "baseline" point (a reference line on charts);
# hf-batched and transformers serve are measured at every sweep point, so each is a series
# like a server; the headline's speedups are against each of them at the same point.
BASELINE_KINDS = ("hf-sequential", "hf-static-cache")
POINT_BASELINE_KINDS = ("hf-batched", "transformers-serve")
HF_KINDS = (*BASELINE_KINDS, "hf-batched")


@dataclass
class RunResults:
    """A run's points: vLLM series per sweep, HF baselines, failed points."""

    points: list[PointStats]
    slo: dict[str, float] | None = None
    server_metrics: list[dict[str, Any]] = field(default_factory=list)
    sweep_order: list[str] = field(default_factory=list)
    # The backend the reader chose as the reference (``?reference=`` on the run page): a
    # single-point baseline, or a backend measured at the sweep points (hf-batched,
    # transformers serve, a vLLM configuration), compared point by point. None (or a name
    # the run does not have): the default rule of ``reference``.
    chosen_reference: str | None = None

    def __post_init__(self) -> None:
        if self.sweep_order:
            self.points.sort(
                key=lambda p: (p.backend_kind == "vllm", self._sweep_order(p.sweep), p.backend, p.x)
            )
        self._series: list[Series] | None = None
        self._baselines: dict[str, PointStats] | None = None

    @property
    def baselines(self) -> dict[str, PointStats]:
        """The single-point baselines, the reference first (hf-sequential when the run
        has one), then the others in point order (built once: ``speedup`` reads it for
        every point)."""
        if self._baselines is None:
            found = [p for p in self.points if p.backend_kind in BASELINE_KINDS and p.ok]
            found.sort(key=lambda p: p.backend_kind != "hf-sequential")  # stable
            self._baselines = {p.backend: p for p in found}
        return self._baselines

    def series(self) -> list[Series]:
        if self._series is None:
            self._series = self._build_series()
        return self._series

    def _build_series(self) -> list[Series]:
        grouped: dict[tuple[str, str, str], list[PointStats]] = defaultdict(list)
        for p in self.points:
            if p.backend_kind in BASELINE_KINDS or not p.ok:
                continue
            grouped[(p.sweep, p.axis or "max_concurrency", p.backend)].append(p)
        out = [
            Series(backend, sweep, axis, sorted(pts, key=lambda p: p.x))
            for (sweep, axis, backend), pts in grouped.items()
        ]
        out.sort(key=lambda s: (self._sweep_order(s.sweep), s.backend))
        return out

    def _sweep_order(self, sweep: str) -> int:
        order = self.sweep_order or list(dict.fromkeys(p.sweep for p in self.points))
        return order.index(sweep) if sweep in order else len(order)

    def sweeps(self) -> list[str]:
        return list(dict.fromkeys(s.sweep for s in self.series()))

    def reference_choices(self) -> list[tuple[str, str]]:
        """(backend, kind) of every backend a reader may take as the reference: the
        single-point baselines, then the backends measured at sweep points."""
        seen: dict[str, str] = {b.backend: b.backend_kind for b in self.baselines.values()}
        for p in self.points:
            if p.ok and p.backend_kind not in BASELINE_KINDS:
                seen.setdefault(p.backend, p.backend_kind)
        return list(seen.items())

    @property
    def reference_name(self) -> str | None:
        """The backend every speedup on the page is over: the reader's choice when the run
        has it, else the sequential loop (``hf-sequential``) when the run has one, else
        its first other single-point baseline."""
        chosen = self.chosen_reference
        if chosen and any(name == chosen for name, _ in self.reference_choices()):
            return chosen
        default = self._default_reference
        return default.backend if default is not None else None

    @property
    def _default_reference(self) -> PointStats | None:
        return next(iter(self.baselines.values()), None)

    @property
    def reference_is_baseline(self) -> bool:
        """Whether the reference is one single-point baseline (else it is compared at each
        sweep point)."""
        return self.reference_name in self.baselines

    @property
    def reference(self) -> PointStats | None:
        """The single-point baseline that the headline speedup, the summary's Speedup
        column and the throughput chart's "Nx" labels are over (``reference_name``); None
        when the reference is a backend measured per point (``reference_at``). Every label
        names it: a speedup over a compiled static-cache loop must never read as one over
        the sequential loop."""
        name = self.reference_name
        return self.baselines.get(name) if name else None

    def reference_at(self, point: PointStats) -> PointStats | None:
        """What ``point`` is compared with: the reference baseline, or the reference
        backend's measurement at the same sweep point (None when it has none there, and
        for the reference's own points)."""
        name = self.reference_name
        if name is None or point.backend == name:
            return None
        if name in self.baselines:
            return self.baselines[name]
        return next(
            (
                p
                for p in self.points
                if p.backend == name and p.ok and p.point_key == point.point_key
            ),
            None,
        )

    def speedup(self, point: PointStats, key: str = "output_throughput") -> float | None:
        """The point's ``key`` over the reference's (``reference_at``), when both exist."""
        if point.backend_kind in BASELINE_KINDS:
            return None
        base = self.reference_at(point)
        ref = base.get(key) if base else None
        value = point.get(key)
        if not ref or value is None:
            return None
        return value / ref

    def speedups(self, point: PointStats, key: str = "output_throughput") -> list[dict]:
        """The point's ``key`` over every Hugging Face baseline's: each single-point
        baseline, and hf-batched (batch = its concurrency) and transformers serve at the
        same sweep point."""
        value = point.get(key)
        if value is None:
            return []
        refs = list(self.baselines.values()) + [
            p
            for p in self.points
            if p.backend_kind in POINT_BASELINE_KINDS and p.ok and p.point_key == point.point_key
        ]
        return [
            {"backend": p.backend, "kind": p.backend_kind, "speedup": value / p.get(key)}
            for p in refs
            if p.get(key) and p is not point
        ]


_FACT_COLUMNS = (
    "status", "error", "backend_kind", "input_len", "output_len", "concurrency",
    "num_prompts", "request_rate", "metrics", "server_metrics", "preemptions",
    "kv_cache_usage_peak",
)  # fmt: skip


def facts_of(row: Mapping[str, Any], conditions: Any = None, raw: Any = None) -> dict[str, Any]:
    """A stored measurement's columns (``_FACT_COLUMNS``, as ``values()`` gives them) as
    ``runners.bottleneck.diagnose`` reads a result document's measurement."""
    server = dict(row.get("server_metrics") or {})
    for column in ("preemptions", "kv_cache_usage_peak"):
        if row.get(column) is not None:
            server[column] = row[column]
    return {
        "status": row.get("status"),
        "error": row.get("error") or "",
        "backend_kind": row.get("backend_kind"),
        "point": {
            "input_len": row.get("input_len"),
            "output_len": row.get("output_len"),
            "max_concurrency": row.get("concurrency"),
            "num_prompts": row.get("num_prompts"),
            "request_rate": row.get("request_rate"),
        },
        "metrics": row.get("metrics") or {},
        "server_metrics": server,
        "conditions": conditions or {},
        "raw": raw or {},
    }


def deferred_fields(m: Any) -> set[str]:
    """The fields a query deferred on a model row (none for another object with the same
    fields, such as a test's or a document's row)."""
    of = getattr(m, "get_deferred_fields", None)
    return of() if callable(of) else set()


def bottleneck_facts(m: Measurement) -> dict[str, Any]:
    """``facts_of`` a row (a model instance, or any object with its fields); fields a
    query deferred, or the object does not have, count as not recorded, so no extra query
    is made."""
    deferred = deferred_fields(m)

    def loaded(name: str) -> Any:
        return None if name in deferred else getattr(m, name, None)

    row = {name: loaded(name) for name in _FACT_COLUMNS}
    return facts_of(row, loaded("conditions"), loaded("raw"))


def _aggregate_values(point: PointStats, rows: list[dict[str, float]]) -> None:
    """Mean, sample standard deviation, min and max of each key across the repeats (plain
    float arithmetic: ``statistics.stdev`` works in exact fractions and is ~50x slower)."""
    columns: dict[str, list[float]] = defaultdict(list)
    for values in rows:
        for key, value in values.items():
            columns[key].append(value)
    for key in sorted(columns):
        samples = columns[key]
        n = len(samples)
        mean = math.fsum(samples) / n
        point.mean[key] = mean
        point.std[key] = (
            math.sqrt(math.fsum((v - mean) ** 2 for v in samples) / (n - 1)) if n > 1 else 0.0
        )
        point.low[key] = min(samples)
        point.high[key] = max(samples)


def aggregate(
    measurements: Iterable[Measurement],
    extra: Mapping[int, Mapping[str, float]] | None = None,
    key_of: Any = None,
) -> list[PointStats]:
    """PointStats per (backend, point key), in first-seen order.

    ``extra`` adds values per measurement id (goodput computed from per-request arrays).
    ``key_of(m)`` overrides the grouping key (compare groups by run as well).
    """
    extra = extra or {}
    points: dict[Any, PointStats] = {}
    values: dict[Any, list[dict[str, float]]] = defaultdict(list)
    for m in measurements:
        key = key_of(m) if key_of else (m.backend, m.point_key)
        point = points.get(key)
        if point is None:
            point = points[key] = PointStats(
                backend=m.backend,
                backend_kind=m.backend_kind,
                point_key=m.point_key,
                sweep=m.sweep,
                axis=m.axis or None,
                value=m.value,
                input_len=m.input_len,
                output_len=m.output_len,
                concurrency=m.concurrency,
                num_prompts=m.num_prompts,
            )
        point.facts.append(bottleneck_facts(m))
        if m.status != "succeeded":
            point.failed += 1
            if m.error and len(point.errors) < 3:
                point.errors.append(m.error)
            continue
        row = measurement_values(m, extra.get(m.pk))
        if not row:
            point.failed += 1
            continue
        point.repeats += 1
        point.ids.append(m.pk)
        values[key].append(row)
    for key, point in points.items():
        _aggregate_values(point, values[key])
    return list(points.values())


def spec_sweeps(spec: Mapping[str, Any]) -> list[str]:
    """The spec's sweep names in its own order (the order pages show them in)."""
    return [str(s.get("name")) for s in spec.get("sweeps") or [] if isinstance(s, Mapping)]


def stored_spec(spec: Mapping[str, Any]) -> rs.Spec | None:
    """A run's stored spec, parsed as stored (``parse_spec(stored=True)``), or None."""
    try:
        return rs.parse_spec(dict(spec), stored=True)
    except rs.SpecError:
        return None


def spec_slo(parsed: rs.Spec | None) -> dict[str, float] | None:
    """The run's SLO as {ttft_ms, tpot_ms, e2el_ms} (given ones only), or None."""
    return parsed.slo.model_dump(exclude_none=True) if parsed and parsed.slo else None


def detail_arrays(measurement_ids: list[int]) -> dict[int, dict[str, Any]]:
    """The per-request arrays goodput needs, without the large ITL lists (one query)."""
    keys = ("ttfts", "latencies", "output_lens", "errors")
    return samples.details(measurement_ids, keys, with_duration=True)


def goodput_extra(
    measurements: Iterable[Measurement],
    slo_for: Callable[[Measurement], Mapping[str, float] | None],
) -> dict[int, dict[str, float]]:
    """Goodput and SLO attainment per measurement id, for measurements whose run has an
    SLO (``slo_for(m)``): the client's own goodput when it reported one, else computed from
    the per-request arrays (one query for all of those together)."""
    extra: dict[int, dict[str, float]] = {}
    need: dict[int, Mapping[str, float]] = {}
    for m in measurements:
        slo = slo_for(m)
        if not slo or m.status != "succeeded" or m.backend_kind != "vllm":
            continue
        reported = goodput.from_metrics(m.metrics or {})
        if reported is not None:
            extra[m.pk] = reported
        else:
            need[m.pk] = slo
    for pk, detail in detail_arrays(list(need)).items():
        computed = goodput.from_detail(detail, need[pk])
        if computed is not None:
            extra[pk] = computed
    return extra


def without_superseded(spec: rs.Spec | None, measurements: list[Any]) -> list[Any]:
    """``measurements`` less the SLA search measurements a confirmation replaced
    (``runners.sla.superseded``): a point's numbers are its confirmation's."""
    return sla.without_superseded(spec, measurements, lambda m: (m.backend, m.point_key, m.repeat))


# Per-request arrays a run page reads for request-level intervals: not the token gaps
# (by far the largest), so ITL statistics get an interval from repeats only.
_INTERVAL_KEYS = ("ttfts", "latencies", "output_lens", "input_lens", "errors")
_RATES = ("request_throughput", "output_throughput", "total_token_throughput")


def attach_request_intervals(results: RunResults, confidence: float = 0.95) -> None:
    """Give every point measured once its request-level intervals (``PointStats.requests``):
    throughput from the per-request rates (delta method), latency statistics from their
    samples (order statistics for percentiles, t for means). One query, for those points'
    samples without their token gaps; points with repeats keep their run-to-run spread."""
    attach_point_intervals(results.points, confidence)


def attach_point_intervals(points: Iterable[PointStats], confidence: float = 0.95) -> None:
    """``attach_request_intervals`` for some points; those that have theirs are skipped."""
    once = [p for p in points if p.repeats == 1 and p.ids and not p.requests]
    found = samples.details([p.ids[0] for p in once], _INTERVAL_KEYS)
    for point in once:
        detail = found.get(point.ids[0]) or {}
        if not detail:
            continue
        of = detail.get("sample_of") if isinstance(detail.get("sample_of"), int) else 0
        for rate in _RATES:
            pair = stats.rate_samples(detail, rate)
            value = point.mean.get(rate)
            if pair is None or value is None:
                continue
            point.samples = len(pair[0])
            found_interval = stats.rate_interval(pair[0], pair[1], value, confidence)
            if found_interval is not None:
                (lo, hi), method = found_interval
                point.requests[rate] = Uncertainty(value, lo, hi, method, 1, len(pair[0]), of)
        for metric_key, value in point.mean.items():
            metric = judged_metric(metric_key)
            if metric is None or metric.latency in (None, "itl"):
                continue
            values = stats.latency_samples(detail, metric.latency)
            interval = stats.value_interval(values, metric.quantile, confidence)
            if interval is not None:
                (lo, hi), method = interval
                point.requests[metric_key] = Uncertainty(value, lo, hi, method, 1, len(values), of)


# --------------------------------------------------------------------------- load sweeps
# Rules on a load sweep's points (each point one load level: concurrency or request
# rate): which points no other beats on both throughput and latency, and the most
# throughput within a latency budget. The run page's charts, its budget box and its
# headline all read them here.

LOAD_AXES = ("max_concurrency", "request_rate")
PARETO_LATENCY = "p99_ttft_ms"
PARETO_THROUGHPUT = "output_throughput"


def attach_roofline(series: Series | None, roofline: Iterable[Any]) -> None:
    """Each point of ``series`` (the capacity panel's concurrency sweep) gets the decode
    roofline fraction the panel computed at its x (``runners.roofline.RooflinePoint``)."""
    if series is None:
        return
    by_x = {r.x: r.fraction for r in roofline}
    for p in series.points:
        p.roofline_fraction = by_x.get(p.x)


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


def efficiency(point: PointStats, gpus: int) -> tuple[float, float] | None:
    """(output tok/s per user, output tok/s per GPU) of a load point: what a serving
    configuration trades (InferenceX's and vLLM's ``plot_pareto`` axes). Per user is
    1000 / median TPOT (one user's decode speed); per GPU is the point's output tok/s
    over the GPUs it used (over one server on a CPU run, ``gpus`` = 0). None without
    both numbers."""
    tpot = point.get("p50_tpot_ms")
    throughput = point.get("output_throughput")
    if not tpot or throughput is None:
        return None
    return 1000.0 / tpot, throughput / max(gpus, 1)


def higher_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other beats on both coordinates (both higher-better),
    sorted by the first."""
    return pareto_front([(-x, y) for x, y in points])


def load_points(series: Series) -> list[tuple[float, float, float]]:
    """(x, p99 TTFT, output tok/s) of a series' points that measured both."""
    out = []
    for p in series.points:
        latency, throughput = p.get(PARETO_LATENCY), p.get(PARETO_THROUGHPUT)
        if latency is not None and throughput is not None:
            out.append((p.x, latency, throughput))
    return out


def best_within_budget(
    points: list[tuple[float, float, float]], budget_ms: float
) -> tuple[float, float, float] | None:
    """(x, latency, throughput) with the highest throughput whose latency <= budget."""
    ok = [p for p in points if p[1] <= budget_ms]
    return max(ok, key=lambda p: p[2], default=None)


def default_ttft_budget(
    results: RunResults, spec: rs.Spec | None = None
) -> tuple[float, str] | None:
    """The p99 TTFT budget a reader starts from, and where it comes from: the spec's SLO
    when it sets one, else the SLA search's p99 TTFT limit (so the box and the search's
    answer speak of one budget), else the median p99 TTFT over the load sweeps' points
    (rounded to two significant digits), so about half of them fit. None without load
    points."""
    if results.slo and results.slo.get("ttft_ms"):
        return float(results.slo["ttft_ms"]), "the spec's SLO"
    search = spec.sla_search if spec is not None else None
    if search is not None and search.slo.get("p99_ttft_ms"):
        return float(search.slo["p99_ttft_ms"]), "the SLA search's SLO"
    latencies = sorted(
        latency
        for s in results.series()
        if s.axis in LOAD_AXES
        for _, latency, _ in load_points(s)
        if latency > 0
    )
    if not latencies:
        return None
    mid = len(latencies) // 2
    median = latencies[mid] if len(latencies) % 2 else (latencies[mid - 1] + latencies[mid]) / 2
    rounded = float(f"{median:.2g}")
    return rounded, "the median p99 TTFT of the measured load points"
