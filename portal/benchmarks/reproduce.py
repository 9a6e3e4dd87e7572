"""Re-runs: submit a run's spec again, find the original, and say whether it reproduced.

A re-run is an ordinary run of the same spec, named ``Re-run of <original public id>``
(nothing is added to the spec, so it measures exactly the same thing). The original is
found from that name among the same owner's runs (anyone can name a run "Re-run of
<id>", only the owner re-runs it) and must be visible to the reader; the two are comparable when
their fingerprints (model, workload, engine configuration, GPU type) are equal.

Reproduced means: at every point both runs measured, the re-run's mean output tok/s lies
within the spread (min to max) of the original's repeats, or within ``TOLERANCE`` of the
original's value when it had a single repeat.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from portal.benchmarks import queries, services
from portal.benchmarks.models import Run
from portal.benchmarks.points import METRIC_BY_KEY, PointStats, RunResults

RERUN_PREFIX = "Re-run of "
TOLERANCE = 0.05
METRIC = "output_throughput"
_ORIGINAL = re.compile(r"^Re-run of ([a-z0-9]{20})$")


def rerun_name(run: Run) -> str:
    return f"{RERUN_PREFIX}{run.public_id}"


def rerun(run: Run, user: AbstractBaseUser) -> Run:
    """Queue the same spec again for ``user`` (the owner, or staff); PermissionError else."""
    if not queries.can_cancel(user, run):
        raise PermissionError("only the run's owner can re-run it")
    return services.create_run(user, run.spec, rerun_name(run))


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
    label: str
    original: float
    low: float
    high: float
    value: float
    repeats: int

    @property
    def within(self) -> bool:
        return self.low <= self.value <= self.high

    @property
    def delta(self) -> float:
        return self.value / self.original - 1.0 if self.original else 0.0


@dataclass
class Verdict:
    comparable: bool
    reproduced: bool | None
    summary: str
    checks: list[PointCheck] = field(default_factory=list)


def _band(point: PointStats, key: str) -> tuple[float, float, float] | None:
    mean = point.get(key)
    if mean is None:
        return None
    if point.repeats > 1:
        return mean, point.low[key], point.high[key]
    return mean, mean * (1 - TOLERANCE), mean * (1 + TOLERANCE)


def verdict(
    original: Run, original_results: RunResults, rerun_run: Run, rerun_results: RunResults
) -> Verdict:
    """Whether ``rerun_run`` reproduced ``original`` (see the module docstring)."""
    metric = METRIC_BY_KEY[METRIC]
    if not any(p.ok for p in rerun_results.points):
        return Verdict(
            True,
            None,
            "The re-run has no results yet; it is checked against the original's spread "
            "as its measurements arrive.",
        )
    if not original.fingerprint or original.fingerprint != rerun_run.fingerprint:
        return Verdict(
            False,
            None,
            "Not comparable: the two runs differ in model, workload, engine configuration "
            "or GPU type (their fingerprints differ).",
        )
    theirs = {(p.backend, p.point_key): p for p in original_results.points if p.ok}
    checks = []
    for p in rerun_results.points:
        other = theirs.get((p.backend, p.point_key))
        value = p.get(METRIC)
        band = _band(other, METRIC) if other is not None else None
        if band is None or value is None:
            continue
        label = f"{p.backend} {p.label}"
        checks.append(PointCheck(label, band[0], band[1], band[2], value, other.repeats))
    if not checks:
        return Verdict(True, None, "No point has results in both runs yet.")
    how = (
        f"the spread (min to max) of the original's {checks[0].repeats} repeats"
        if all(c.repeats > 1 for c in checks)
        else f"the original's spread, or ±{TOLERANCE:.0%} where it had one repeat"
    )
    off = [c for c in checks if not c.within]
    if not off:
        return Verdict(
            True,
            True,
            f"Reproduced: {metric.label} at all {len(checks)} points is within {how}.",
            checks,
        )
    worst = max(off, key=lambda c: abs(c.delta))
    return Verdict(
        True,
        False,
        f"Not reproduced: {metric.label} at {len(off)} of {len(checks)} points is outside "
        f"{how}; the largest gap is {worst.label}: {worst.value:,.1f} against "
        f"{worst.low:,.1f} to {worst.high:,.1f} ({worst.delta:+.1%}).",
        checks,
    )
