"""Re-runs: submit a run's spec again, find the original, and say whether it reproduced.

A re-run is an ordinary run of the same spec, named ``Re-run of <original public id>``
(nothing is added to the spec, so it measures exactly the same thing). The original is
found from that name among the same owner's runs (anyone can name a run "Re-run of
<id>", only the owner re-runs it) and must be visible to the reader.

"Reproduced?" is the compare page's verdict, from the same engine with the same inputs
(``portal.benchmarks.compare``, i.e. ``servebench.verdict``), on the metrics a CI gate
judges by default (``servebench.verdict.DEFAULT_METRICS``) at every point both runs
measured, with the original as the baseline:

- **not comparable** when the fingerprints differ (what differs is listed);
- **not reproduced** when any of them is ``worse`` or ``better`` (beyond the threshold and
  the run-to-run noise);
- **cannot tell** when some change is beyond the threshold but its run-to-run noise was
  not measured (one repeat, no history of the series): set ``repeats: 2`` or more;
- **reproduced** otherwise: every change is within the threshold or within the noise.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from portal.benchmarks import compare as cmp
from portal.benchmarks import intake, queries
from portal.benchmarks.models import Run
from servebench import verdict as engine
from servebench.verdict import MetricVerdict

RERUN_PREFIX = "Re-run of "
_ORIGINAL = re.compile(r"^Re-run of ([a-z0-9]{20})\Z")


def rerun_name(run: Run) -> str:
    return f"{RERUN_PREFIX}{run.public_id}"


def rerun(run: Run, user: AbstractBaseUser) -> Run:
    """Queue the same spec again for ``user`` (the owner, or staff); PermissionError else."""
    if not queries.can_cancel(user, run):
        raise PermissionError("only the run's owner can re-run it")
    return intake.create_run(user, run.spec, rerun_name(run))


def original_id(run: Run) -> str | None:
    match = _ORIGINAL.match(run.name or "")
    return match.group(1) if match else None


def original_of(user: AbstractBaseUser | AnonymousUser, run: Run) -> Run | None:
    """The run this one re-ran, if ``user`` may see it (one query; none for other runs)."""
    public_id = original_id(run)
    if public_id is None or public_id == run.public_id:
        return None
    return (
        queries.visible_runs(user)
        # The same owner: anyone can *name* a run "Re-run of <id>"; only the owner re-runs.
        .filter(public_id=public_id, owner_id=run.owner_id, created_at__lte=run.created_at)
        .defer(*queries.LIST_DEFERRED)
        .first()
    )


def reruns_of(user: AbstractBaseUser | AnonymousUser, run: Run, limit: int = 20) -> list[Run]:
    """Re-runs of ``run`` that ``user`` may see, oldest first (one query)."""
    return list(
        queries.visible_runs(user)
        .filter(name=rerun_name(run), owner_id=run.owner_id)
        .defer(*queries.LIST_DEFERRED)
        .order_by("created_at", "id")[:limit]
    )


@dataclass
class PointCheck:
    """One judged metric at one point: the original's value, this run's, the verdict."""

    label: str
    metric: str
    original: float | None
    value: float | None
    judgement: MetricVerdict
    backend: str = ""
    point_key: str = ""

    @property
    def delta(self) -> float | None:
        return self.judgement.change

    @property
    def verdict(self) -> str:
        return self.judgement.verdict

    @property
    def interval(self) -> tuple[float, float] | None:
        return self.judgement.interval

    @property
    def interval_text(self) -> str:
        """``-3.1% to +4.0%`` (an end the data cannot bound: ``+inf``), or ``—``."""
        return interval_text(self.judgement.interval)


def interval_text(interval: tuple[float, float] | None) -> str:
    if interval is None:
        return "—"
    lo, hi = (f"{x:+.1%}" if math.isfinite(x) else f"{x:+}" for x in interval)
    return f"{lo} to {hi}"


@dataclass
class Verdict:
    comparable: bool
    reproduced: bool | None
    summary: str
    checks: list[PointCheck] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)


GATE_METRICS = tuple(engine.parse_metric(m).key for m in engine.DEFAULT_METRICS)
_HEADLINE = "output_throughput"


def _describe(checks: list[PointCheck], limit: int = 3) -> str:
    parts = []
    for c in checks[:limit]:
        span = f", interval {c.interval_text}" if c.interval is not None else ""
        parts.append(f"{c.label} {c.metric} {c.delta:+.1%} ({c.verdict}{span})")
    more = f"; and {len(checks) - limit} more" if len(checks) > limit else ""
    return "; ".join(parts) + more


def verdict(user: AbstractBaseUser | AnonymousUser, original: Run, rerun_run: Run) -> Verdict:
    """Whether ``rerun_run`` reproduced ``original`` (see the module docstring)."""
    comparison = cmp.compare(user, [original.public_id, rerun_run.public_id], original.public_id)
    column = comparison.columns[1]
    if not any(p.ok for p in column.results.points):
        return Verdict(
            column.comparable,
            None,
            "The re-run has no results yet; it is checked against the original as its "
            "measurements arrive.",
        )
    if not column.comparable:
        differences = [str(d) for d in column.differences]
        what = "; ".join(differences[:4]) or "their fingerprints differ"
        return Verdict(
            False,
            None,
            f"Not comparable: the two runs measured different things ({what}), so whether "
            "it reproduced cannot be judged.",
            differences=differences,
        )
    checks = []
    for row in comparison.rows:
        judgement = row.judgements[1]
        if judgement is None or judgement.metric not in GATE_METRICS:
            continue
        if judgement.verdict in (engine.NO_DATA, engine.NOT_COMPARABLE):
            continue
        label = f"{row.point.backend} {row.point.short}"
        checks.append(
            PointCheck(
                label,
                row.metric.label,
                row.values[0],
                row.values[1],
                judgement,
                row.point.backend,
                row.point.point_key,
            )
        )
    if not checks:
        return Verdict(True, None, "No point has results in both runs yet.")
    points = len({c.label for c in checks})
    changed = [c for c in checks if c.verdict in engine.COLOURED]
    unmeasured = [c for c in checks if c.verdict == engine.UNMEASURED]
    if changed:
        return Verdict(
            True,
            False,
            f"Not reproduced: {len(changed)} of {len(checks)} judged numbers changed beyond "
            f"the threshold and the run-to-run noise: {_describe(changed)}.",
            checks,
        )
    if unmeasured:
        return Verdict(
            True,
            None,
            f"Cannot tell: {len(unmeasured)} of {len(checks)} judged numbers changed by more "
            "than the threshold, but the run-to-run noise was not measured (one repeat and "
            f"no history of this configuration): {_describe(unmeasured)}. Set repeats: 2 "
            "or more in the spec to check a re-run.",
            checks,
        )
    return Verdict(
        True,
        True,
        f"Reproduced: at all {points} points, every judged number "
        f"({', '.join(dict.fromkeys(c.metric for c in checks))}) is within the threshold or "
        "within the run-to-run noise.",
        checks,
    )


def shown_checks(result: Verdict) -> list[PointCheck]:
    """The checks a page lists: the headline throughput at every point, and any other
    number that changed or whose noise was not measured."""
    return [
        c
        for c in result.checks
        if c.judgement.metric == _HEADLINE or c.verdict in (*engine.COLOURED, engine.UNMEASURED)
    ]
