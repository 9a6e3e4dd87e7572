"""History of one comparable series: a headline metric at one point, run after run.

Runs that share ``Run.fingerprint`` measured the same workload, sweep points and GPU type
and count, so their numbers line up over time; what may change between them is what
they put under test: the configuration (model, engine flags: ``Run.config_fingerprint``)
and the software (vLLM, PyTorch, driver, CUDA, image). ``history()`` returns one value
per run (the mean over its repeats; an SLA search load measured again is its
confirmation's, ``queries.current``) with the versions it ran on, and labels each point
where the configuration or a version changed from the previous one (a marker on the
chart).

Three queries whatever the length of the history (the newest run for the title, the
points on offer, the series itself, aggregated in SQL); at most ``MAX_POINTS`` runs, the
newest.

The same series is where the verdict's run-to-run noise comes from when runs have one
repeat (``noise_history``): the newest ``servebench.verdict.LOOKBACK`` succeeded runs of
the base's owner with its fingerprint, created before the candidate, one value per run
and point (two queries).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Avg, Count, F, OuterRef, StdDev
from django.db.models.fields.json import KeyTextTransform, KeyTransform

from portal.benchmarks import points as pts
from portal.benchmarks import queries, runview
from portal.benchmarks.models import Measurement, Run, RunStatus
from runners import fingerprint as rf
from runners.choices import choice_message
from servebench import verdict
from servebench.compare import backend_label

MAX_POINTS = 1000
FINGERPRINT_RE = re.compile(r"^[0-9a-f]{8,64}\Z")

# Metrics stored as columns (aggregated in SQL): the headline ones.
HISTORY_METRICS: tuple[str, ...] = (
    "output_throughput",
    "request_throughput",
    "total_token_throughput",
    *(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for stat in ("p50", "p90", "p99")),
    *(f"mean_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")),
    "preemptions",
    "kv_cache_usage_peak",
    "gpu_memory_peak_bytes",
)

# (label, the value's path from a measurement row)
VERSIONS: tuple[tuple[str, Any], ...] = (
    ("vLLM", "run__environment__vllm_version"),
    ("PyTorch", "run__environment__torch_version"),
    ("Transformers", "run__environment__transformers_version"),
    ("Driver", "run__environment__driver"),
    ("CUDA", "run__environment__cuda"),
    ("Image", KeyTextTransform("image", KeyTransform("container", "run__environment__snapshot"))),
    (
        "Image digest",
        KeyTextTransform("image_digest", KeyTransform("container", "run__environment__snapshot")),
    ),
    ("Runner", "run__runner_version"),
)


class HistoryError(ValueError):
    """A bad query parameter; ``field`` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


@dataclass
class HistoryPoint:
    public_id: str
    name: str
    created_at: datetime
    value: float
    std: float
    repeats: int
    versions: dict[str, str]
    changes: list[str] = field(default_factory=list)
    run_pk: int = 0
    configuration: str = ""  # Run.config_fingerprint
    labels: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"/runs/{self.public_id}/"


@dataclass
class PointChoice:
    backend: str
    point_key: str
    sweep: str
    value: float | None


@dataclass
class History:
    fingerprint: str
    metric: pts.Metric
    point_key: str
    backend: str
    latest: Run
    choices: list[PointChoice]
    points: list[HistoryPoint]
    truncated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "metric": {
                "key": self.metric.key,
                "label": self.metric.label,
                "unit": self.metric.unit,
            },
            "point": self.point_key,
            "backend": self.backend,
            "model": self.latest.model_id,
            "gpu": self.latest.gpu_name,
            "truncated": self.truncated,
            "points": [
                {
                    "run": p.public_id,
                    "name": p.name,
                    "url": p.url,
                    "created_at": p.created_at.isoformat(),
                    "value": p.value,
                    "std": p.std,
                    "repeats": p.repeats,
                    "versions": p.versions,
                    "changes": p.changes,
                    "labels": p.labels,
                }
                for p in self.points
            ],
            "points_available": [
                {"backend": c.backend, "point": c.point_key} for c in self.choices
            ],
        }


def _default_point(choices: list[PointChoice]) -> PointChoice | None:
    """The highest concurrency of the first concurrency sweep, else the first point."""
    conc = [c for c in choices if ":max_concurrency=" in c.point_key]
    if conc:
        sweep = conc[0].sweep
        return max((c for c in conc if c.sweep == sweep), key=lambda c: c.value or 0)
    return choices[0] if choices else None


def label_changes(points: list[HistoryPoint]) -> None:
    """Fill ``changes`` with "vLLM 0.31.0 → 0.32.0" for every version that differs from
    the previous point's (points in time order)."""
    prev: dict[str, str] | None = None
    for point in points:
        if prev is not None:
            point.changes = [
                f"{label} {prev.get(label) or '—'} → {value or '—'}"
                for label, value in point.versions.items()
                if (prev.get(label) or "") != (value or "")
            ]
        prev = point.versions


def label_configuration_changes(points: list[HistoryPoint]) -> None:
    """Prepend to ``changes`` what each run changed in the configuration from the previous
    point's (``runners.fingerprint.Identity.changes``: "vllm.max_num_seqs: default → 1"),
    where its ``config_fingerprint`` differs. The specs and environments are read only for
    the runs on either side of a change (one query each)."""
    pairs = [
        (prev, point)
        for prev, point in itertools.pairwise(points)
        if prev.configuration != point.configuration
    ]
    if not pairs:
        return
    runs = Run.objects.filter(pk__in={p.run_pk for pair in pairs for p in pair}).only("pk", "spec")
    views = {v.run.pk: v for v in runview.load_many(list(runs), results=False)}
    for prev, point in pairs:
        a, b = views.get(prev.run_pk), views.get(point.run_pk)
        if a is None or b is None or a.identity is None or b.identity is None:
            point.changes.insert(0, "configuration changed")
            continue
        found = [
            d.change for d in rf.differences(a.identity.configuration, b.identity.configuration)
        ]
        point.changes[:0] = found or ["configuration changed"]


def history(
    user: AbstractBaseUser | AnonymousUser,
    fingerprint: str,
    metric: str = "output_throughput",
    point: str | None = None,
    backend: str | None = None,
    limit: int = MAX_POINTS,
) -> History:
    """The series; Run.DoesNotExist when ``user`` sees no run with this fingerprint."""
    if not FINGERPRINT_RE.match(fingerprint or ""):
        raise Run.DoesNotExist("not a fingerprint")
    if metric not in HISTORY_METRICS:
        raise HistoryError("metric", choice_message(metric, HISTORY_METRICS, "metric"))
    runs = queries.visible_runs(user).filter(fingerprint=fingerprint)
    latest = runs.select_related(None).defer(*queries.LIST_DEFERRED).order_by("-created_at").first()
    if latest is None:
        raise Run.DoesNotExist("no visible run with this fingerprint")
    ok = queries.current(
        Measurement.objects.filter(run__in=runs, status="succeeded", backend_kind="vllm")
    )
    choices = [
        PointChoice(b, k, s, v)
        for b, k, s, v in ok.order_by("backend", "sweep", "value")
        .values_list("backend", "point_key", "sweep", "value")
        .distinct()
    ]
    if point is None:
        chosen = _default_point(choices)
        point = chosen.point_key if chosen else ""
        backend = backend or (chosen.backend if chosen else "")
    elif not any(c.point_key == point for c in choices):
        raise HistoryError("point", f"no point {point[:80]!r} in this series")
    if not backend:
        backend = next((c.backend for c in choices if c.point_key == point), "")

    versions = {
        f"v{i}": F(path) if isinstance(path, str) else path for i, (_, path) in enumerate(VERSIONS)
    }
    rows = (
        ok.filter(point_key=point, backend=backend, **{f"{metric}__isnull": False})
        .values(
            "run_id",
            "run__public_id",
            "run__name",
            "run__created_at",
            "run__config_fingerprint",
            **versions,
            labels=queries.labels(OuterRef("run_id")),
        )
        .annotate(mean=Avg(metric), std=StdDev(metric, sample=True), n=Count("id"))
        .order_by("-run__created_at", "-run_id")[: limit + 1]
    )
    rows = list(rows)
    truncated = len(rows) > limit
    series = [
        HistoryPoint(
            public_id=r["run__public_id"],
            name=r["run__name"],
            created_at=r["run__created_at"],
            value=float(r["mean"]),
            std=float(r["std"] or 0.0),
            repeats=int(r["n"]),
            versions={label: str(r[f"v{i}"] or "") for i, (label, _) in enumerate(VERSIONS)},
            run_pk=r["run_id"],
            configuration=r["run__config_fingerprint"] or "",
            labels=queries.sorted_labels(r["labels"]),
        )
        for r in reversed(rows[:limit])
    ]
    label_changes(series)
    label_configuration_changes(series)
    return History(
        fingerprint=fingerprint,
        metric=pts.METRIC_BY_KEY[metric],
        point_key=point,
        backend=backend,
        latest=latest,
        choices=choices,
        points=series,
        truncated=truncated,
    )


# --------------------------------------------------------------------------- noise


@dataclass(frozen=True)
class SeriesRun:
    pk: int
    public_id: str
    created_at: datetime


# (backend label, point key) -> the engine's metric key -> one value per run, oldest first
SeriesValues = dict[tuple[str, str], dict[str, list[float]]]


def series_runs(
    user: AbstractBaseUser | AnonymousUser,
    fingerprint: str,
    owner_id: int,
    *,
    until: datetime | None = None,
    configuration: str = "",
) -> list[SeriesRun]:
    """The succeeded runs of one series that ``user`` may see, oldest first: the runs of
    ``owner_id`` with this fingerprint (created before ``until``, when given) and, when
    ``configuration`` is given, that configuration (``Run.config_fingerprint``): the
    noise of one configuration is not widened by the changes between configurations.
    Only one owner's runs count, so nobody else's runs can widen the noise a gate is
    judged by. One query over the (fingerprint, created_at) index."""
    runs = queries.visible_runs(user).filter(
        fingerprint=fingerprint, owner_id=owner_id, status=RunStatus.SUCCEEDED
    )
    if configuration:
        runs = runs.filter(config_fingerprint=configuration)
    if until is not None:
        runs = runs.filter(created_at__lt=until)
    return [
        SeriesRun(pk, public_id, created_at)
        for pk, public_id, created_at in runs.order_by("created_at", "id").values_list(
            "pk", "public_id", "created_at"
        )
    ]


def earlier(
    runs: list[SeriesRun], candidate: Run, lookback: int = verdict.LOOKBACK
) -> list[SeriesRun]:
    """The newest ``lookback`` of ``runs`` created before ``candidate`` (never itself)."""
    before = [r for r in runs if r.created_at < candidate.created_at and r.pk != candidate.pk]
    return before[-lookback:] if lookback > 0 else []


# the judged history metrics stored as columns -> the engine's key for each
_NOISE_METRICS = {
    m: judged.key for m in HISTORY_METRICS if (judged := verdict.judged_metric(m)) is not None
}


def run_values(runs: list[SeriesRun]) -> dict[int, dict[tuple[str, str], dict[str, float]]]:
    """Per run: (backend label, point key) -> the engine's metric key -> the run's value
    (the mean over its succeeded repeats), for the judged metrics stored as columns. One
    query, aggregated in SQL. Backends are labelled as the compare verdict labels them
    (``servebench.compare.backend_label``), so a renamed backend stays in its series."""
    if not runs:
        return {}
    rows = list(
        queries.current(
            Measurement.objects.filter(run_id__in=[r.pk for r in runs], status="succeeded")
        )
        .values("run_id", "backend", "backend_kind", "point_key")
        .annotate(**{f"m_{key}": Avg(key) for key in _NOISE_METRICS})
        .order_by()
    )
    kinds: dict[int, dict[str, set[str]]] = {}
    for row in rows:
        kinds.setdefault(row["run_id"], {}).setdefault(row["backend_kind"], set()).add(
            row["backend"]
        )
    out: dict[int, dict[tuple[str, str], dict[str, float]]] = {}
    for row in rows:
        counts = {kind: len(names) for kind, names in kinds[row["run_id"]].items()}
        label = backend_label(row["backend_kind"], row["backend"], counts)
        values = out.setdefault(row["run_id"], {}).setdefault((label, row["point_key"]), {})
        for key, judged in _NOISE_METRICS.items():
            value = row[f"m_{key}"]
            if value is not None:
                values[judged] = float(value)
    return out


def series_values(
    chosen: list[SeriesRun], values: dict[int, dict[tuple[str, str], dict[str, float]]]
) -> SeriesValues:
    """The history the verdict takes: per point and metric, the chosen runs' values in
    their order (a run without the value is skipped)."""
    out: SeriesValues = {}
    for run in chosen:
        for point, metrics in values.get(run.pk, {}).items():
            series = out.setdefault(point, {})
            for key, value in metrics.items():
                series.setdefault(key, []).append(value)
    return out


def noise_history(
    user: AbstractBaseUser | AnonymousUser,
    fingerprint: str,
    owner_id: int,
    before: Run,
    lookback: int = verdict.LOOKBACK,
    configuration: str = "",
) -> tuple[list[SeriesRun], SeriesValues]:
    """The earlier runs of a series that the verdict's run-to-run noise comes from, and
    their values: the newest ``lookback`` succeeded runs of ``owner_id`` with this
    fingerprint (and ``configuration``, when given) created before ``before`` (two
    queries)."""
    runs = series_runs(
        user, fingerprint, owner_id, until=before.created_at, configuration=configuration
    )
    chosen = earlier(runs, before, lookback)
    return chosen, series_values(chosen, run_values(chosen))
