"""Side-by-side comparison of runs: metrics per point relative to a baseline run, the
engine's verdict on each change, and the environment fields that differ.

``compare(user, ids, baseline)`` reads everything in a fixed number of queries (runs,
measurements, environments; the series' earlier runs and their values when the noise
needs them; the per-request samples of the changes beyond the threshold; goodput arrays
when an SLO needs them), whatever the number of runs or points. The web page and
``GET /api/v1/compare/`` both render its ``Comparison``.

- **Comparable?** A run is comparable with the baseline when their fingerprints agree
  (``runners.fingerprint``: one definition for the runner, the portal and the CLI); else
  every change is "not comparable" and ``Column.differences`` says what differs.
- **Verdicts**: ``servebench.verdict.compare_metric``, the engine ``servebench compare``
  and the re-run check call too, with the same inputs: each run's repeats of the point
  (the client's reported metrics, per-request samples read through
  ``portal.benchmarks.samples``), and the base's series history (``history.noise_history``)
  for the run-to-run noise. Only ``worse`` and ``better`` are coloured.
- Points match across runs by (backend, point key). A run's backend is named by its kind
  ("vllm", "hf-sequential") when it is the run's only backend of that kind, so runs whose
  single vLLM backends carry different names still line up.

The environment diff lists only the fields whose values are not all equal: software
versions (vLLM, PyTorch, driver, CUDA...), the GPU, the model and its revision, dtype
and context length, the workload, every vLLM server flag, the image and its digest.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from portal.benchmarks import history as hist
from portal.benchmarks import points as pts
from portal.benchmarks import queries, runview, samples
from portal.benchmarks.models import Environment, Run
from runners import envfacts
from runners import fingerprint as rf
from runners.vllm_server import serve_flags
from servebench import verdict as engine
from servebench.compare import backend_label

MAX_RUNS = 12
# The metrics whose verdicts a comparison counts: the CLI's defaults (engine keys), and
# correctness and speculation where a run measured them (the CLI judges those too).
COUNTED = frozenset(engine.parse_metric(name).key for name in engine.DEFAULT_METRICS) | set(
    engine.QUALITY_METRICS
)
_ID = re.compile(r"^[a-z0-9]{1,40}\Z")


class SelectionError(ValueError):
    """A bad ``runs`` or ``baseline`` parameter; ``field`` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def parse_selection(
    runs: str | Sequence[str] | None, baseline: str | None = None, field: str = "reference"
) -> tuple[list[str], str]:
    """``runs=a,b,c`` (or repeated ``runs``) and the reference run -> (ids in order, the
    reference). The reference defaults to the first run and must be one of the selected;
    ``field`` is the parameter that named it (``reference``, or ``baseline`` in older
    links), which an error names.
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
        raise SelectionError(field, f"the reference run {chosen[:40]!r} is not among the runs")
    return ids, chosen


# --------------------------------------------------------------------------- environment


def environment_fields(view: runview.LoadedRun) -> dict[str, str]:
    """The comparable facts of one run: environment snapshot, model, workload, server
    flags. Run-specific noise (host name, pod, capture time) is left out."""
    run, spec = view.run, view.spec
    out: dict[str, str] = dict(envfacts.facts(view.snapshot, envfacts.COMPARED))
    out.setdefault("GPU", run.gpu_name or "—")
    if spec is None:
        return out
    out["Model"] = spec.model.id
    out["dtype"] = spec.model.dtype
    out["Max model length"] = str(spec.model.max_model_len)
    for key, value in spec.workload.model_dump(mode="json").items():
        out[f"workload.{key}"] = envfacts.text(value)
    out["Sweeps"] = "; ".join(f"{s.name}: {s.axis} {envfacts.text(s.values)}" for s in spec.sweeps)
    out["Repeats"] = str(spec.repeats)
    if spec.slo:
        out["SLO"] = envfacts.text(spec.slo.model_dump(exclude_none=True))
    for backend in spec.vllm_backends:
        out[f"vLLM server args ({backend.name})"] = " ".join(
            f for f in serve_flags(spec, backend) if f != "--disable-uvicorn-access-log"
        )
    for backend in [*spec.hf_backends, *spec.batched_backends]:
        config = backend.model_dump(exclude={"kind", "name"}, exclude_none=True)
        out[f"HF baseline ({backend.name})"] = envfacts.text(config)
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
    """One compared run (loaded once: ``view``): its points, and how it stands against
    the baseline."""

    view: runview.LoadedRun
    points: dict[tuple[str, str], pts.PointStats] = field(default_factory=dict)
    sides: dict[tuple[str, str], engine.Side] = field(default_factory=dict)
    ids: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    comparable: bool = True
    differences: list[rf.Difference] = field(default_factory=list)  # what it measured else
    changes: list[rf.Difference] = field(default_factory=list)  # what it changed (judged)
    quality_note: str = ""  # the model changed: answers' quality is not measured
    contended: list[str] = field(default_factory=list)  # points measured under contention
    history_runs: int = 0

    @property
    def run(self) -> Run:
        return self.view.run

    @property
    def results(self) -> pts.RunResults:
        assert self.view.results is not None  # compare loads every run with its results
        return self.view.results

    @property
    def environment(self) -> Environment | None:
        return self.view.environment

    @property
    def label(self) -> str:
        return f"{self.run.name or self.run.model_id} ({self.run.short_id})"

    @property
    def gpus(self) -> int:
        """GPUs the run measured on (its measurement's; 0 on a CPU)."""
        identity = self.view.identity
        count = identity.measurement["gpu"]["count"] if identity is not None else None
        return count if isinstance(count, int) else (self.run.gpu_count or 0)


def _column(view: runview.LoadedRun) -> Column:
    """A run's column: its succeeded points keyed by (backend label, point key) and the
    verdict engine's sides (each repeat's metrics and measurement ids)."""
    column = Column(view)
    results = column.results
    kinds: dict[str, int] = defaultdict(int)
    for _name, kind in {(m.backend, m.backend_kind) for m in view.measurements}:
        kinds[kind] += 1
    labels = {}
    for p in results.points:
        if p.ok:
            label = backend_label(p.backend_kind, p.backend, kinds)
            labels[(p.backend, p.point_key)] = label
            column.points[(label, p.point_key)] = p
    for m in sorted(view.measurements, key=lambda m: (m.repeat, m.pk)):
        label = labels.get((m.backend, m.point_key))
        if label is None or m.status != "succeeded":
            continue
        if (m.conditions or {}).get("contended"):
            where = f"{label} {m.point_key}"
            if where not in column.contended:
                column.contended.append(where)
        side = column.sides.setdefault((label, m.point_key), engine.Side())
        side.metrics.append(m.metrics or {})
        column.ids.setdefault((label, m.point_key), []).append(m.pk)
    return column


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
    verdicts: list[str]  # "better", "worse" or "" per run: the colour (baseline: "")
    judgements: list[engine.MetricVerdict | None] = field(default_factory=list)


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

    @property
    def contended(self) -> list[Column]:
        """The runs with a point measured under CPU contention (the reference included)."""
        return [c for c in self.columns if c.contended]

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

    # The metrics the ranking orders configurations by: (key, better).
    RANKED = ("output_throughput", "request_goodput", "p99_ttft_ms", "p50_tpot_ms")

    def ranking(self) -> list[dict[str, Any]]:
        """Per ranked metric: the comparable runs (the reference included) best first, by
        the metric's median change against the reference over the points all share
        (``headline``); a metric no two runs share is left out. Ranks are plain order,
        not verdicts: the per-point verdicts say which differences are beyond noise."""
        comparable = [i for i, c in enumerate(self.columns) if c.comparable]
        out = []
        for key in self.RANKED:
            metric = pts.METRIC_BY_KEY.get(key)
            changes = self.headline(key)
            found = [(i, 0.0 if i == self.baseline else changes[i]) for i in comparable]
            found = [(i, c) for i, c in found if c is not None]
            if metric is None or len(found) < 2:
                continue
            sign = -1.0 if metric.better == "higher" else 1.0
            order = sorted(found, key=lambda item: sign * item[1])
            out.append({"metric": metric, "order": order})
        return out

    def limits(self, i: int) -> Counter[str]:
        """What limited run ``i``'s load points (``runners.bottleneck``), cause -> points."""
        found: Counter[str] = Counter()
        for p in self.columns[i].points.values():
            if p.backend_kind in ("vllm", "endpoint") and (limit := p.bottleneck):
                found[limit.cause] += 1
        return found

    def why_winner(self, key: str = "output_throughput") -> str | None:
        """Why the first of the ranking on ``key`` wins: what limited its points against
        what limited the runner-up's (``limits``); None without a ranking on ``key``."""
        rank = next((r for r in self.ranking() if r["metric"].key == key), None)
        if rank is None:
            return None
        (first, _), (second, _) = rank["order"][:2]

        def ranked(i: int) -> list[tuple[str, int]]:
            # most points first; on a tie a known cause before "unknown"
            found = self.limits(i)
            return sorted(found.items(), key=lambda item: (-item[1], item[0] == "unknown"))

        def said(i: int) -> str:
            causes = ranked(i)
            total = sum(n for _, n in causes)
            if not total:
                return "not known (no load point was diagnosed)"
            return ", ".join(f"{c} at {n} of {total} points" for c, n in causes[:3])

        name = [self.columns[i].label for i in (first, second)]
        text = (
            f"{name[0]} ranks first on {rank['metric'].label}; what limited its load points: "
            f"{said(first)}; the runner-up {name[1]}'s: {said(second)}"
        )
        a, b = ranked(first), ranked(second)
        if a and b and a[0][0] == b[0][0] != "unknown":
            text += f". Both were held mostly by {a[0][0]}: the winner went faster under it"
        return text + "."

    def efficiency(self) -> list[dict[str, Any]]:
        """Per comparable run: its load points as (tok/s per user, tok/s per GPU)
        (``points.efficiency``), and which of all of them are on the Pareto front."""
        entries = []
        for i, column in enumerate(self.columns):
            if not column.comparable:
                continue
            gpus = column.gpus
            found = []
            for (backend, _key), p in column.points.items():
                if p.backend_kind != "vllm" and p.backend_kind != "endpoint":
                    continue
                if p.axis not in pts.LOAD_AXES:
                    continue
                xy = pts.efficiency(p, gpus)
                if xy is not None:
                    found.append((xy, p, backend))
            if found:
                entries.append({"index": i, "points": found})
        flat = [(e["index"], xy) for e in entries for xy, _, _ in e["points"]]
        front = {flat[j] for j in pts.higher_front([xy for _, xy in flat])}
        for e in entries:
            e["front"] = [(e["index"], xy) in front for xy, _, _ in e["points"]]
        return entries

    def counts(self, i: int) -> dict[str, int]:
        """Run ``i``'s verdicts against the reference, per verdict word, in the engine's
        order (worse first); empty for the reference. Counted over the metrics
        ``servebench compare`` judges by default (``COUNTED``), so the page, the API and
        the CLI count the same verdicts; the per-point table judges every metric."""
        found: dict[str, int] = defaultdict(int)
        for row in self.rows:
            judgement = row.judgements[i] if row.judgements else None
            if judgement is not None and judgement.metric in COUNTED:
                found[judgement.verdict] += 1
        return {word: found[word] for word in engine.VERDICTS if found.get(word)}

    def as_dict(self) -> dict[str, Any]:
        """The API's answer (plain JSON)."""
        return {
            "reference": self.baseline_run.public_id,
            "baseline": self.baseline_run.public_id,  # the old name of "reference"
            "runs": [
                {
                    "id": c.run.public_id,
                    "name": c.run.name,
                    "model": c.run.model_id,
                    "gpu": c.run.gpu_name,
                    "status": c.run.status,
                    "created_at": c.run.created_at.isoformat(),
                    "url": c.run.get_absolute_url(),
                    "fingerprint": c.run.fingerprint,
                    "comparable": c.comparable,
                    "differences": [
                        {"field": d.field, "baseline": d.base, "run": d.other}
                        for d in c.differences
                    ],
                    "changes": [
                        {"field": d.name, "baseline": d.base, "run": d.other, "text": d.change}
                        for d in c.changes
                    ],
                    "quality_note": c.quality_note,
                    "contended": c.contended,
                    "history_runs": c.history_runs,
                    "verdicts": self.counts(i),
                }
                for i, c in enumerate(self.columns)
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
                    "verdicts": [j.brief() if j else None for j in r.judgements],
                }
                for r in self.rows
            ],
            "verdict_rules": {
                "threshold": engine.DEFAULT_THRESHOLD,
                "confidence": engine.DEFAULT_CONFIDENCE,
                "bootstrap": engine.DEFAULT_BOOTSTRAP,
                "seed": 0,
                "min_history": engine.MIN_HISTORY,
                "lookback": engine.LOOKBACK,
            },
            "ranking": [
                {
                    "metric": r["metric"].key,
                    "runs": [
                        {"id": self.columns[i].run.public_id, "change": change}
                        for i, change in r["order"]
                    ],
                }
                for r in self.ranking()
            ],
            "environment_diff": [{"field": e.label, "values": e.values} for e in self.env_diff],
            # why the first on output tok/s wins: what limited its points and the runner-up's
            "ranking_why": self.why_winner(),
        }


def metric_rows(
    columns: Sequence[Column], baseline: int, metrics: Iterable[pts.Metric] = pts.METRICS
) -> tuple[list[PointRef], list[MetricRow]]:
    """Every (point, metric) any run has, with each run's value and its relative
    difference to the baseline run's (verdicts are filled by ``judge``)."""
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
            blank = [""] * len(columns)
            rows.append(MetricRow(ref, metric, values, deltas, blank, [None] * len(columns)))
    return [r for _, r in ordered], rows


def _seed(label: str, point_key: str) -> str:
    # servebench.compare.compare_documents seeds each point so (seed 0).
    return f"0|{label}|{point_key}"


def judge(
    user: AbstractBaseUser | AnonymousUser,
    columns: Sequence[Column],
    baseline: int,
    rows: Sequence[MetricRow],
) -> None:
    """Fill every row's verdicts with the engine, at its defaults (the CLI's): history of
    the baseline's series (two queries, when a comparable run needs it) and per-request
    samples only where they could change a verdict (``Assessment.needs_samples``; one
    query)."""
    base = columns[baseline]
    others = [i for i in range(len(columns)) if i != baseline]
    histories: dict[int, hist.SeriesValues] = {}
    comparable = [i for i in others if columns[i].comparable]
    if comparable and base.run.fingerprint:
        newest = max(columns[i].run.created_at for i in comparable)
        series = hist.series_runs(
            user,
            base.run.fingerprint,
            base.run.owner_id,
            until=newest,
            configuration=base.run.config_fingerprint,
        )
        chosen = {i: hist.earlier(series, columns[i].run) for i in comparable}
        union = {r.pk: r for runs in chosen.values() for r in runs}
        values = hist.run_values(list(union.values()))
        for i in comparable:
            histories[i] = hist.series_values(chosen[i], values)
            enough = len(chosen[i]) >= engine.MIN_HISTORY
            columns[i].history_runs = len(chosen[i]) if enough else 0
    # One cell per (row, compared run): its run-to-run part assessed once (engine.assess),
    # which says whether samples could change its verdict (``again``); the cells that need
    # none conclude from it, those that do are assessed again once their samples are loaded.
    cells = []
    for row in rows:
        metric = engine.judged_metric(row.metric.key)
        key = (row.point.backend, row.point.point_key)
        base_side = base.sides.get(key)
        if metric is None or base_side is None:
            continue
        for i in others:
            side = columns[i].sides.get(key)
            if side is None:
                continue
            series = histories.get(i, {}).get(key, {}).get(metric.key)
            found = engine.assess(
                metric, base_side, side, history=series, comparable=columns[i].comparable
            )
            again = found.needs_samples()
            cells.append((row, metric, key, i, base_side, side, series, found, again))
    needed: set[int] = set()
    gaps = False  # the token gaps, by far the largest arrays, only for an ITL statistic
    for _row, metric, key, i, *_, again in cells:
        if again:
            needed.update(base.ids[key])
            needed.update(columns[i].ids[key])
            gaps = gaps or metric.latency == "itl"
    if needed:
        keys = None if gaps else [k for k in samples.KEYS if k != "itls"]
        found_details = samples.details(needed, keys)
        for column in columns:
            for key, side in column.sides.items():
                if any(pk in found_details for pk in column.ids[key]):
                    side.details = [found_details.get(pk, {}) for pk in column.ids[key]]
    for row, metric, key, i, base_side, side, series, found, again in cells:
        judgement = engine.compare_metric(
            metric,
            base_side,
            side,
            history=series,
            comparable=columns[i].comparable,
            seed=_seed(*key),
            assessed=None if again else found,
        )
        row.judgements[i] = judgement
        row.verdicts[i] = judgement.coloured


def place(reference: Column, column: Column) -> None:
    """How ``column`` stands against the reference run: comparable when both measured the
    same thing (``runners.fingerprint``: workload, points, GPU); then what it changed
    (configuration and software) is the change being judged, else what it measured
    differently is listed and nothing is judged."""
    a, b = reference.view.identity, column.view.identity
    if a is None or b is None:  # a spec that no longer parses: the stored fingerprints
        column.comparable = column.run.fingerprint == reference.run.fingerprint != ""
        return
    column.differences = a.differences(b)
    column.comparable = not column.differences
    if column.comparable:
        column.changes = a.changes(b)
        column.quality_note = rf.quality_note(a, b)


def compare(
    user: AbstractBaseUser | AnonymousUser, ids: Sequence[str], baseline: str
) -> Comparison:
    """The comparison of the runs ``ids`` (all visible to ``user``, else Run.DoesNotExist)."""
    runs = {r.public_id: r for r in queries.visible_runs(user).filter(public_id__in=list(ids))}
    missing = [i for i in ids if i not in runs]
    if missing:
        raise Run.DoesNotExist(f"no run {missing[0]!r} that you can see")
    views = runview.load_many([runs[i] for i in ids])
    columns = [_column(view) for view in views]
    base = ids.index(baseline)
    for i, column in enumerate(columns):
        if i != base:
            place(columns[base], column)
    refs, rows = metric_rows(columns, base)
    judge(user, columns, base, rows)
    diff = environment_diff([environment_fields(c.view) for c in columns])
    return Comparison(columns, base, rows, diff, refs)
