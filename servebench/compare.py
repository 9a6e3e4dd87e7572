"""Two result documents side by side: points matched, one verdict per metric.

Input is the result document (``runners.result.ResultDocument`` JSON, as
``GET /api/v1/runs/{id}/result`` or ``python -m runners run --out`` gives it), so a
comparison needs no portal: two ``--out`` files compare the same way. The verdict is
``servebench.verdict.compare_metric``, the engine the portal's pages call too.

- **Comparable?** Each document's spec and environment give its two identities
  (``runners.fingerprint``: what it measured, what it put under test), computed here and
  never taken from a stored field. When the measurements differ (workload, points, GPU),
  every metric is ``not comparable`` and the differences are listed; when they agree,
  the configuration and software differences are the change being judged (``changes``).
- **Contention**: the points each side measured under CPU contention
  (``conditions.contended``) are listed; a gate may refuse to judge them.
- **Points** match by (backend, point key). A backend is named by its kind (``vllm``,
  ``hf-sequential``) when it is its run's only backend of that kind, as on the portal's
  compare page, so runs whose single vLLM backends carry different names still line up.
  Repeats of a point are grouped (in repeat order); failed measurements are left out (a
  run with failed points is a failed run, which ``servebench compare`` refuses before
  getting here).
- **History** (optional): per (backend, point key), per metric, one value per earlier run
  of the base's series, as ``GET /api/v1/history/?point=*`` gives them: the run-to-run
  noise when the runs have one repeat.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runners import fingerprint as rf
from runners import sla
from runners import spec as rs
from servebench.verdict import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_CONFIDENCE,
    DEFAULT_METRICS,
    DEFAULT_THRESHOLD,
    QUALITY_METRICS,
    WORSE,
    MetricVerdict,
    Side,
    compare_metric,
    parse_metric,
)

# (backend label, point key) -> metric key -> one value per earlier run of the series
History = Mapping[tuple[str, str], Mapping[str, Sequence[float]]]


@dataclass
class Point:
    """One backend at one sweep point of one run, its succeeded repeats grouped."""

    backend: str
    key: str
    side: Side = field(default_factory=Side)

    @property
    def label(self) -> str:
        return f"{self.backend} {self.key}"


@dataclass
class PointComparison:
    backend: str
    key: str
    base_repeats: int
    candidate_repeats: int
    verdicts: list[MetricVerdict]

    @property
    def label(self) -> str:
        return f"{self.backend} {self.key}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "point": self.key,
            "base_repeats": self.base_repeats,
            "candidate_repeats": self.candidate_repeats,
            "metrics": [v.as_dict() for v in self.verdicts],
        }


@dataclass
class Comparison:
    """Every matched point's verdicts, and the points only one run has."""

    points: list[PointComparison]
    only_base: list[str]
    only_candidate: list[str]
    metrics: list[str]
    threshold: float
    thresholds: dict[str, float]
    confidence: float
    n_boot: int
    seed: int
    comparable: bool = True
    differences: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    quality_note: str = ""
    # Points measured under CPU contention, per side ("base", "candidate").
    contended: dict[str, list[str]] = field(default_factory=dict)

    @property
    def is_contended(self) -> bool:
        return any(self.contended.values())

    def contention_text(self) -> str:
        """One sentence on which side was measured under contention ('' when neither)."""
        sides = [
            f"the {side} ({len(points)} point{'s' if len(points) != 1 else ''}: "
            f"{', '.join(points[:3])}{', ...' if len(points) > 3 else ''})"
            for side, points in self.contended.items()
            if points
        ]
        if not sides:
            return ""
        return (
            f"Measured under CPU contention: {' and '.join(sides)}; other processes took "
            "the cores its measurement needed, so a change may be the machine, not the "
            "configuration."
        )

    @property
    def regressions(self) -> list[tuple[PointComparison, MetricVerdict]]:
        return [(p, v) for p in self.points for v in p.verdicts if v.verdict == WORSE]

    @property
    def regressed(self) -> bool:
        return bool(self.regressions)

    def counts(self) -> Counter[str]:
        return Counter(v.verdict for p in self.points for v in p.verdicts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "regressed": self.regressed,
            "comparable": self.comparable,
            "differences": self.differences,
            "changes": self.changes,
            "quality_note": self.quality_note,
            "contended": self.contended,
            "verdicts": dict(self.counts()),
            "metrics": self.metrics,
            "threshold": self.threshold,
            "thresholds": self.thresholds,
            "confidence": self.confidence,
            "bootstrap": self.n_boot,
            "seed": self.seed,
            "points": [p.as_dict() for p in self.points],
            "only_in_base": self.only_base,
            "only_in_candidate": self.only_candidate,
        }


def points_of(document: Mapping[str, Any]) -> dict[tuple[str, str], Point]:
    """The succeeded measurements of a result document grouped per (backend label, point
    key), in document order."""
    measurements = sla.without_superseded(  # a confirmed load: its confirmation's numbers
        _search_spec(document),
        [m for m in document.get("measurements") or [] if isinstance(m, dict)],
        _identity,
    )
    kinds = Counter(
        str(kind or "")
        for kind, _ in {(m.get("backend_kind"), m.get("backend")) for m in measurements}
    )
    out: dict[tuple[str, str], Point] = {}
    for m in sorted(measurements, key=lambda m: m.get("repeat") or 0):
        if m.get("status") != "succeeded":
            continue
        kind, name = str(m.get("backend_kind") or ""), str(m.get("backend") or "")
        label = backend_label(kind, name, kinds)
        key = str((m.get("point") or {}).get("key") or "")
        point = out.setdefault((label, key), Point(label, key))
        point.side.metrics.append(m.get("metrics") or {})
        point.side.details = [*(point.side.details or []), m.get("detail") or {}]
    return out


def _search_spec(document: Mapping[str, Any]) -> rs.Spec | None:
    """The document's spec when it has an SLA search (else no parse), or None."""
    spec = document.get("spec")
    if not (isinstance(spec, Mapping) and spec.get("sla_search")):
        return None
    try:
        return rs.parse_spec(dict(spec), stored=True)
    except rs.SpecError:
        return None


def _identity(m: Mapping[str, Any]) -> tuple[str, str, int]:
    key = str((m.get("point") or {}).get("key") or "")
    return str(m.get("backend") or ""), key, int(m.get("repeat") or 0)


def backend_label(kind: str, name: str, kinds: Mapping[str, int]) -> str:
    """How a run's backend is matched across runs: its kind when the run has one backend
    of that kind, else its name (``kinds``: the run's backend count per kind)."""
    return kind if kind and kinds.get(kind, 0) == 1 else name


@dataclass
class Placement:
    """How a candidate document stands against its base (``runners.fingerprint``)."""

    comparable: bool
    differences: list[str] = field(default_factory=list)  # what it measured differently
    changes: list[str] = field(default_factory=list)  # what it changed: the judged change
    quality_note: str = ""


def identity_of(document: Mapping[str, Any]) -> rf.Identity | None:
    """The document's identities, computed from its spec and environment (never taken
    from a stored field); None when its spec does not parse."""
    try:
        spec = rs.parse_spec(document.get("spec"), stored=True)
    except rs.SpecError:
        return None
    environment = document.get("environment")
    return rf.Identity.of(spec, environment if isinstance(environment, Mapping) else None)


def placement(base: Mapping[str, Any], candidate: Mapping[str, Any]) -> Placement:
    """Comparable when both documents measured the same thing (workload, points, GPU);
    then their configuration and software changes are what is judged. A spec that does
    not parse falls back to the documents' ``fingerprint`` fields."""
    a, b = identity_of(base), identity_of(candidate)
    if a is None or b is None:
        same = bool(base.get("fingerprint")) and base.get("fingerprint") == candidate.get(
            "fingerprint"
        )
        return Placement(same, [] if same else ["fingerprint"])
    differences = a.differences(b)
    if differences:
        return Placement(False, [str(d) for d in differences])
    return Placement(True, [], [d.change for d in a.changes(b)], rf.quality_note(a, b))


def contended_points(document: Mapping[str, Any]) -> list[str]:
    """'backend point' of each succeeded measurement the runner took under CPU
    contention (``runners.conditions``), in document order, once each."""
    out: list[str] = []
    for m in document.get("measurements") or []:
        if not isinstance(m, Mapping) or m.get("status") != "succeeded":
            continue
        conditions = m.get("conditions")
        if isinstance(conditions, Mapping) and conditions.get("contended"):
            where = f"{m.get('backend')} {(m.get('point') or {}).get('key')}"
            if where not in out:
                out.append(where)
    return out


def compare_documents(
    base: Mapping[str, Any],
    candidate: Mapping[str, Any],
    metrics: Iterable[str] = DEFAULT_METRICS,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    thresholds: Mapping[str, float] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    history: History | None = None,
) -> Comparison:
    """Compare ``candidate`` with ``base`` on ``metrics`` at every point both measured.

    ``thresholds`` overrides ``threshold`` per metric key (``{"p99_ttft_ms": 0.1}``);
    ``history`` gives the base's series' earlier runs (module doc). ValueError for an
    unknown metric name.
    """
    parsed = [parse_metric(name) for name in metrics]
    keys = list(dict.fromkeys(m.key for m in parsed))
    per_metric = {parse_metric(k).key: v for k, v in (thresholds or {}).items()}
    placed = placement(base, candidate)
    comparable = placed.comparable
    base_points = points_of(base)
    cand_points = points_of(candidate)
    compared: list[PointComparison] = []
    for ident, bp in base_points.items():
        cp = cand_points.get(ident)
        if cp is None:
            continue
        series = _engine_keys((history or {}).get(ident) or {})
        # Correctness and speculation are judged wherever a side measured them: a faster
        # configuration that changes the answers is a regression like a slower one.
        sides = [*bp.side.metrics, *cp.side.metrics]
        extra = [q for q in QUALITY_METRICS if q not in keys and any(q in m for m in sides)]
        verdicts = [
            compare_metric(
                parse_metric(key),
                bp.side,
                cp.side,
                history=series.get(key),
                comparable=comparable,
                threshold=per_metric.get(key, threshold),
                confidence=confidence,
                n_boot=n_boot,
                seed=f"{seed}|{bp.backend}|{bp.key}",
            )
            for key in [*keys, *extra]
        ]
        compared.append(
            PointComparison(bp.backend, bp.key, bp.side.repeats, cp.side.repeats, verdicts)
        )
    return Comparison(
        points=compared,
        only_base=[p.label for i, p in base_points.items() if i not in cand_points],
        only_candidate=[p.label for i, p in cand_points.items() if i not in base_points],
        metrics=keys,
        threshold=threshold,
        thresholds=per_metric,
        confidence=confidence,
        n_boot=n_boot,
        seed=seed,
        comparable=comparable,
        differences=placed.differences,
        changes=placed.changes,
        quality_note=placed.quality_note,
        contended={"base": contended_points(base), "candidate": contended_points(candidate)},
    )


def _engine_keys(series: Mapping[str, Sequence[float]]) -> dict[str, Sequence[float]]:
    """History keyed as the engine names metrics (``p50_ttft_ms`` -> ``median_ttft_ms``)."""
    out: dict[str, Sequence[float]] = {}
    for key, values in series.items():
        try:
            out[parse_metric(key).key] = values
        except ValueError:
            continue
    return out


def describe_methods(comparison: Comparison) -> list[str]:
    """One line per distinct method used, for the footer of a table or a PR comment."""
    seen: dict[str, str] = {}
    for p in comparison.points:
        for v in p.verdicts:
            if v.method not in ("", "-"):
                seen.setdefault(v.method, v.detail)
    return [f"{method}: e.g. {detail}" for method, detail in seen.items()]


def notes(comparison: Comparison) -> list[str]:
    """Distinct notes (few samples for a p99, one repeat...) across the comparison."""
    out: list[str] = []
    for p in comparison.points:
        for v in p.verdicts:
            for note in v.notes:
                if note not in out:
                    out.append(note)
    return out
