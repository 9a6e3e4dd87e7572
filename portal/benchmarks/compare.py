"""Side-by-side comparison of runs: metrics per point relative to a baseline run, and the
environment fields that differ.

``compare(user, ids, baseline)`` reads everything in a fixed number of queries (runs,
measurements, environments; one more for goodput arrays when an SLO needs them),
whatever the number of runs or points. The web page and ``GET /api/v1/compare/`` both
render its ``Comparison``.

Points match across runs by (backend, point key). A run's backend is named by its kind
("vllm", "hf-sequential") when it is the run's only backend of that kind, so runs whose
single vLLM backends carry different names still line up.

The environment diff lists only the fields whose values are not all equal: software
versions (vLLM, PyTorch, driver, CUDA...), the GPU, the model and its revision, dtype
and context length, the workload, every vLLM server flag, the image and its digest.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from portal.benchmarks import points as pts
from portal.benchmarks import queries
from portal.benchmarks.models import Environment, Measurement, Run
from runners import spec as rs
from runners.environment import get as env_get
from runners.vllm_server import serve_flags

MAX_RUNS = 12
_ID = re.compile(r"^[a-z0-9]{1,40}$")


class SelectionError(ValueError):
    """A bad ``runs`` or ``baseline`` parameter; ``field`` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def parse_selection(
    runs: str | Sequence[str] | None, baseline: str | None = None
) -> tuple[list[str], str]:
    """``runs=a,b,c`` (or repeated ``runs``) and ``baseline`` -> (ids in order, baseline).

    The baseline defaults to the first run and must be one of the selected.
    """
    raw = [runs] if isinstance(runs, str) else list(runs or [])
    ids: list[str] = []
    for chunk in raw:
        for part in str(chunk).split(","):
            part = part.strip()
            if not part:
                continue
            if not _ID.match(part):
                raise SelectionError("runs", f"{part[:40]!r} is not a run id")
            if part not in ids:
                ids.append(part)
    if len(ids) < 1:
        raise SelectionError("runs", "choose at least one run (runs=<id>,<id>,...)")
    if len(ids) > MAX_RUNS:
        raise SelectionError("runs", f"compare at most {MAX_RUNS} runs at once ({len(ids)} given)")
    chosen = (baseline or "").strip() or ids[0]
    if chosen not in ids:
        raise SelectionError("baseline", f"the baseline {chosen[:40]!r} is not among the runs")
    return ids, chosen


# --------------------------------------------------------------------------- environment

ENV_FIELDS: tuple[tuple[str, str], ...] = (
    ("GPU", "gpu.model"),
    ("GPU count", "gpu.count"),
    ("GPU memory (MiB)", "gpu.memory_total_mib"),
    ("Driver", "gpu.driver_version"),
    ("CUDA (driver)", "gpu.cuda_driver_version"),
    ("CUDA (runtime)", "software.cuda_runtime"),
    ("vLLM", "software.vllm"),
    ("PyTorch", "software.torch"),
    ("Transformers", "software.transformers"),
    ("Triton", "software.triton"),
    ("FlashInfer", "software.flashinfer"),
    ("NCCL", "software.nccl"),
    ("Python", "software.python"),
    ("Model revision", "model.revision"),
    ("Image", "container.image"),
    ("Image digest", "container.image_digest"),
    ("Runner version", "runner_version"),
)


def _text(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_text(v)}" for k, v in value.items())
    return str(value)


def environment_fields(run: Run, snapshot: Mapping[str, Any] | None) -> dict[str, str]:
    """The comparable facts of one run: environment snapshot, model, workload, server
    flags. Run-specific noise (host name, pod, capture time) is left out."""
    snapshot = snapshot or {}
    out: dict[str, str] = {}
    for label, path in ENV_FIELDS:
        value = env_get(dict(snapshot), path)
        if value is not None:
            out[label] = _text(value)
    out.setdefault("GPU", run.gpu_name or "—")
    try:
        spec = rs.parse_spec(run.spec)
    except rs.SpecError:
        return out
    out["Model"] = spec.model.id
    out["dtype"] = spec.model.dtype
    out["Max model length"] = str(spec.model.max_model_len)
    for key, value in spec.workload.model_dump(mode="json").items():
        out[f"workload.{key}"] = _text(value)
    out["Sweeps"] = "; ".join(f"{s.name}: {s.axis} {_text(s.values)}" for s in spec.sweeps)
    out["Repeats"] = str(spec.repeats)
    if spec.slo:
        out["SLO"] = _text(spec.slo.model_dump(exclude_none=True))
    for backend in spec.vllm_backends:
        out[f"vLLM server args ({backend.name})"] = " ".join(
            f for f in serve_flags(spec, backend) if f != "--disable-uvicorn-access-log"
        )
    for backend in spec.hf_backends:
        config = backend.model_dump(exclude={"kind", "name"}, exclude_none=True)
        out[f"HF baseline ({backend.name})"] = _text(config)
    return out


@dataclass
class EnvRow:
    label: str
    values: list[str]


def environment_diff(fields_per_run: Sequence[Mapping[str, str]]) -> list[EnvRow]:
    """Rows for the fields whose values differ between runs (in the first-seen order)."""
    labels = list(dict.fromkeys(label for fields in fields_per_run for label in fields))
    rows = []
    for label in labels:
        values = [fields.get(label, "—") for fields in fields_per_run]
        if len(set(values)) > 1:
            rows.append(EnvRow(label, values))
    return rows


# --------------------------------------------------------------------------- metrics


@dataclass
class Column:
    """One compared run."""

    run: Run
    results: pts.RunResults
    environment: Environment | None
    points: dict[tuple[str, str], pts.PointStats] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.run.name or self.run.model_id} ({self.run.short_id})"


@dataclass
class PointRef:
    backend: str
    point_key: str
    sweep: str
    axis: str | None
    x: float
    label: str
    short: str = ""


@dataclass
class MetricRow:
    point: PointRef
    metric: pts.Metric
    values: list[float | None]
    deltas: list[float | None]
    verdicts: list[str]  # "better", "worse" or "" per run (the baseline's is "")


@dataclass
class Comparison:
    columns: list[Column]
    baseline: int
    rows: list[MetricRow]
    env_diff: list[EnvRow]
    points: list[PointRef]

    @property
    def baseline_run(self) -> Run:
        return self.columns[self.baseline].run

    def headline(self, key: str = "output_throughput") -> list[float | None]:
        """Per run: the median relative difference of ``key`` to the baseline over the
        points both have (None for the baseline itself or without shared points)."""
        out: list[float | None] = []
        for i in range(len(self.columns)):
            deltas = sorted(
                r.deltas[i] for r in self.rows if r.metric.key == key and r.deltas[i] is not None
            )
            if i == self.baseline or not deltas:
                out.append(None)
            else:
                mid = len(deltas) // 2
                out.append(deltas[mid] if len(deltas) % 2 else (deltas[mid - 1] + deltas[mid]) / 2)
        return out

    def as_dict(self) -> dict[str, Any]:
        """The API's answer (plain JSON)."""
        return {
            "baseline": self.baseline_run.public_id,
            "runs": [
                {
                    "id": c.run.public_id,
                    "name": c.run.name,
                    "model": c.run.model_id,
                    "gpu": c.run.gpu_name,
                    "status": c.run.status,
                    "created_at": c.run.created_at.isoformat(),
                    "url": c.run.get_absolute_url(),
                }
                for c in self.columns
            ],
            "metrics": [
                {"key": m.key, "label": m.label, "unit": m.unit, "better": m.better}
                for m in {r.metric.key: r.metric for r in self.rows}.values()
            ],
            "rows": [
                {
                    "backend": r.point.backend,
                    "point": r.point.point_key,
                    "sweep": r.point.sweep,
                    "axis": r.point.axis,
                    "value": r.point.x,
                    "metric": r.metric.key,
                    "values": r.values,
                    "relative_to_baseline": r.deltas,
                }
                for r in self.rows
            ],
            "environment_diff": [{"field": e.label, "values": e.values} for e in self.env_diff],
        }


def backend_label(kind: str, name: str, kinds: Mapping[str, int]) -> str:
    return kind if kinds.get(kind, 0) == 1 else name


def _verdict(metric: pts.Metric, delta: float | None) -> str:
    if delta is None or not metric.better or abs(delta) < 0.005:
        return ""
    improved = delta > 0 if metric.better == "higher" else delta < 0
    return "better" if improved else "worse"


def metric_rows(
    columns: Sequence[Column], baseline: int, metrics: Iterable[pts.Metric] = pts.METRICS
) -> tuple[list[PointRef], list[MetricRow]]:
    """Every (point, metric) any run has, with each run's value and its relative
    difference to the baseline run's."""
    refs: dict[tuple[str, str], PointRef] = {}
    order = [baseline, *[i for i in range(len(columns)) if i != baseline]]
    for i in order:
        for key, p in columns[i].points.items():
            if key not in refs:
                refs[key] = PointRef(key[0], p.point_key, p.sweep, p.axis, p.x, p.label, p.short)
    sweep_order = list(dict.fromkeys(r.sweep for r in refs.values()))
    ordered = sorted(
        refs.items(),
        key=lambda kv: (kv[1].backend.startswith("hf"), sweep_order.index(kv[1].sweep), kv[1].x),
    )
    metrics = list(metrics)
    rows: list[MetricRow] = []
    for key, ref in ordered:
        found = [c.points.get(key) for c in columns]
        for metric in metrics:
            values = [p.get(metric.key) if p is not None else None for p in found]
            if all(v is None for v in values):
                continue
            base = values[baseline]
            deltas = [
                (v / base - 1.0) if v is not None and base not in (None, 0) else None
                for v in values
            ]
            deltas[baseline] = None
            rows.append(
                MetricRow(ref, metric, values, deltas, [_verdict(metric, d) for d in deltas])
            )
    return [r for _, r in ordered], rows


def compare(
    user: AbstractBaseUser | AnonymousUser, ids: Sequence[str], baseline: str
) -> Comparison:
    """The comparison of the runs ``ids`` (all visible to ``user``, else Run.DoesNotExist)."""
    runs = {r.public_id: r for r in queries.visible_runs(user).filter(public_id__in=list(ids))}
    missing = [i for i in ids if i not in runs]
    if missing:
        raise Run.DoesNotExist(f"no run {missing[0]!r} that you can see")
    ordered = [runs[i] for i in ids]
    pks = [r.pk for r in ordered]
    measurements = list(
        Measurement.objects.filter(run_id__in=pks)
        .defer(*Measurement.HEAVY_FIELDS)
        .order_by("run_id", "backend", "sweep", "value", "repeat", "id")
    )
    environments = {e.run_id: e for e in Environment.objects.filter(run_id__in=pks)}
    slos = {r.pk: pts.spec_slo(r.spec) for r in ordered}
    by_run: dict[int, list[Measurement]] = defaultdict(list)
    for m in measurements:
        by_run[m.run_id].append(m)
    extra = pts.goodput_extra(measurements, lambda m: slos.get(m.run_id))
    columns = []
    for run in ordered:
        rows = by_run.get(run.pk, [])
        results = pts.RunResults(
            pts.aggregate(rows, extra), slos.get(run.pk), [], pts.spec_sweeps(run.spec)
        )
        column = Column(run, results, environments.get(run.pk))
        kinds: dict[str, int] = defaultdict(int)
        for b in {(m.backend, m.backend_kind) for m in rows}:
            kinds[b[1]] += 1
        for p in results.points:
            if p.ok:
                label = backend_label(p.backend_kind, p.backend, kinds)
                column.points[(label, p.point_key)] = p
        columns.append(column)
    base = ids.index(baseline)
    refs, rows = metric_rows(columns, base)
    diff = environment_diff(
        [
            environment_fields(c.run, c.environment.snapshot if c.environment else None)
            for c in columns
        ]
    )
    return Comparison(columns, base, rows, diff, refs)
