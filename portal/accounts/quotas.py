"""Fair use: how many runs a user (and a CI token) may have waiting or running, how many
GPU-hours they may ask for in any 24 hours, and where their runs stand in the queue.

Limits come from the settings (``SERVEBENCH_QUOTA_ACTIVE_RUNS``, ``..._GPU_HOURS``, and
``SERVEBENCH_QUOTA_TOKEN_*`` for CI tokens), overridden per user by an admin (``Quota``)
and per token (``ApiToken.max_active_runs`` / ``gpu_hours_per_day``); 0 in a setting
means no limit, 0 in an override means none allowed.

- **Active runs**: queued, dispatched or running. One frees up when one of them ends.
- **GPU-hours**: the runs submitted in the last 24 hours (and older ones still active),
  each charged ``gpu_count x timeout_minutes`` while it waits or runs (what it may take)
  and the GPU time it held (dispatch to end, at most that) once it ended; a run cancelled
  before it was dispatched costs nothing. Charging the whole timeout of a run that ended
  in five minutes would punish generous timeouts, which are the safe habit; charging
  less than the timeout while it runs would let a user queue more than the day holds.
  CPU-only runs (``gpu_count: 0``) cost nothing.
- **Priority**: an admin's grant on the user (``Quota.priority``) or the token
  (``ApiToken.priority``), copied onto the run at submit; the dispatcher takes higher
  priorities first and the oldest first within one (``portal.benchmarks.queue``).

``admit(owner, spec, token)`` checks all of this under a per-user advisory lock inside the
caller's transaction (``intake.create_run``), so two submits at once cannot both take the
last place; it returns the run's priority or raises ``QuotaExceeded``: 409 while the
limit is reached (it frees up: the answer says when), 403 when the run alone exceeds a
limit (it never fits: the answer names the spec fields to change).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.db.models.fields.json import KT
from django.utils import timezone

from portal.accounts.models import ApiToken, Quota
from portal.benchmarks.models import ACTIVE_STATUSES, Run
from runners import spec as rs

WINDOW = timedelta(hours=24)


@dataclass(frozen=True)
class Limits:
    """None: no limit."""

    active_runs: int | None
    gpu_hours: int | None
    priority: int = 0


def _limit(override: int | None, default: int) -> int | None:
    if override is not None:
        return override
    return default or None


def user_limits(user: Any) -> Limits:
    quota = Quota.objects.filter(user_id=user.pk).first()
    if quota is not None and quota.unlimited:
        return Limits(None, None, quota.priority)
    return Limits(
        _limit(quota and quota.max_active_runs, settings.SERVEBENCH_QUOTA_ACTIVE_RUNS),
        _limit(quota and quota.gpu_hours_per_day, settings.SERVEBENCH_QUOTA_GPU_HOURS),
        quota.priority if quota is not None else 0,
    )


def token_limits(token: ApiToken, owner: Limits) -> Limits:
    return Limits(
        _limit(token.max_active_runs, settings.SERVEBENCH_QUOTA_TOKEN_ACTIVE_RUNS),
        _limit(token.gpu_hours_per_day, settings.SERVEBENCH_QUOTA_TOKEN_GPU_HOURS),
        token.priority if token.priority is not None else owner.priority,
    )


def requested_gpu_hours(spec: rs.Spec) -> float:
    """What a run of ``spec`` may take: its GPUs for its whole timeout."""
    return spec.resources.gpu_count * spec.resources.timeout_minutes / 60


@dataclass(frozen=True)
class Usage:
    active_runs: int
    gpu_hours: float
    # (created_at, hours, still active) of the runs in the window, oldest first: when
    # GPU-hours free up.
    charges: tuple[tuple[datetime, float, bool], ...] = ()


def _charge(gpus: Any, timeout: Any, status: str, dispatched: Any, finished: Any) -> float:
    try:
        requested = max(0.0, float(gpus or 0)) * max(0.0, float(timeout or 180)) / 60
    except (TypeError, ValueError):
        return 0.0
    if status in ACTIVE_STATUSES:
        return requested
    if dispatched is None or finished is None:
        return 0.0  # cancelled (or refused) before it was dispatched
    held = max(0.0, (finished - dispatched).total_seconds() / 3600)
    return min(requested, float(gpus or 0) * held)


def usage(runs: Any, now: datetime | None = None) -> Usage:
    """The active runs and GPU-hours of ``runs`` (a Run queryset: one owner's or one
    token's), in two small queries."""
    now = now or timezone.now()
    active = runs.filter(status__in=ACTIVE_STATUSES).count()
    rows = (
        runs.filter(Q(created_at__gte=now - WINDOW) | Q(status__in=ACTIVE_STATUSES))
        .annotate(
            q_gpus=KT("spec__resources__gpu_count"),
            q_timeout=KT("spec__resources__timeout_minutes"),
        )
        .order_by("created_at", "id")
        .values_list("created_at", "q_gpus", "q_timeout", "status", "dispatched_at", "finished_at")
    )
    charges = []
    for created, gpus, timeout, status, dispatched, finished in rows:
        hours = _charge(gpus, timeout, status, dispatched, finished)
        if hours > 0:
            charges.append((created, hours, status in ACTIVE_STATUSES))
    return Usage(active, sum(h for _, h, _ in charges), tuple(charges))


class QuotaExceeded(Exception):
    """A submit refused by fair use: HTTP ``status`` (409: wait, 403: never fits), the
    ``limit`` reached (``active_runs`` or ``gpu_hours_per_day``), whose (``scope``: user
    or token), the numbers, when it frees up (None: when a run ends), and the spec field
    to change (403 only)."""

    def __init__(
        self,
        message: str,
        *,
        status: int,
        limit: str,
        scope: str,
        allowed: float,
        used: float,
        requested: float,
        frees_at: datetime | None = None,
        field: str = "",
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.limit = limit
        self.scope = scope
        self.allowed = allowed
        self.used = used
        self.requested = requested
        self.frees_at = frees_at
        self.field = field

    def retry_after(self, now: datetime | None = None) -> int | None:
        """Seconds until it frees up, when that is known."""
        if self.frees_at is None:
            return None
        return max(1, int((self.frees_at - (now or timezone.now())).total_seconds()) + 1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "scope": self.scope,
            "allowed": self.allowed,
            "used": round(self.used, 2),
            "requested": round(self.requested, 2),
            "frees_at": self.frees_at.isoformat() if self.frees_at else None,
        }


def _frees_at(charges: tuple[tuple[datetime, float, bool], ...], excess: float) -> datetime | None:
    """When enough ended runs leave the 24 h window to free ``excess`` GPU-hours; None
    when only active runs ending would."""
    freed = 0.0
    for created, hours, active in charges:
        if active:
            continue
        freed += hours
        if freed >= excess - 1e-9:
            return created + WINDOW
    return None


def _whose(scope: str, token: ApiToken | None) -> str:
    return f"token {token}" if scope == "token" and token is not None else "your account"


def _check(scope: str, limits: Limits, runs: Any, requested: float, token: ApiToken | None) -> None:
    if limits.active_runs is None and limits.gpu_hours is None:
        return
    now = timezone.now()
    used = usage(runs, now)
    whose = _whose(scope, token)
    if limits.active_runs is not None and used.active_runs >= limits.active_runs:
        raise QuotaExceeded(
            f"{whose} has {used.active_runs} queued or running runs; the limit is "
            f"{limits.active_runs} (fair use: ask an admin for more). One frees up when one "
            "of them ends: cancel one, or submit again later",
            status=409 if limits.active_runs else 403,
            limit="active_runs",
            scope=scope,
            allowed=limits.active_runs,
            used=used.active_runs,
            requested=1,
        )
    if limits.gpu_hours is None or requested <= 0:
        return
    if requested > limits.gpu_hours:
        raise QuotaExceeded(
            f"this run may take {requested:g} GPU-hours (resources.gpu_count x "
            f"resources.timeout_minutes), more than the {limits.gpu_hours} GPU-hours "
            f"{whose} may use in 24 hours; lower the timeout or the GPU count",
            status=403,
            limit="gpu_hours_per_day",
            scope=scope,
            allowed=limits.gpu_hours,
            used=used.gpu_hours,
            requested=requested,
            field="spec.resources.timeout_minutes",
        )
    if used.gpu_hours + requested > limits.gpu_hours:
        frees_at = _frees_at(used.charges, used.gpu_hours + requested - limits.gpu_hours)
        when = (
            f"enough frees up at {frees_at:%Y-%m-%d %H:%M} UTC"
            if frees_at
            else "it frees up as your queued and running runs end (their unused time returns)"
        )
        raise QuotaExceeded(
            f"{whose} has used {used.gpu_hours:.1f} of its {limits.gpu_hours} GPU-hours in "
            f"the last 24 hours and this run may take {requested:g} more; {when}",
            status=409,
            limit="gpu_hours_per_day",
            scope=scope,
            allowed=limits.gpu_hours,
            used=used.gpu_hours,
            requested=requested,
            frees_at=frees_at,
        )


def _lock(user: Any) -> None:
    """Serialise one user's submits until the caller's transaction ends."""
    key = zlib.crc32(f"servebench-quota:{user.pk}".encode())
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def admit(owner: Any, spec: rs.Spec, token: ApiToken | None = None) -> int:
    """The priority of a new run of ``owner``'s (through ``token``, a CI token, if any),
    or QuotaExceeded. Call inside the transaction that stores the run."""
    _lock(owner)
    requested = requested_gpu_hours(spec)
    mine = user_limits(owner)
    _check("user", mine, Run.objects.filter(owner_id=owner.pk), requested, None)
    if token is None or token.kind != ApiToken.Kind.CI:
        return mine.priority
    theirs = token_limits(token, mine)
    _check("token", theirs, Run.objects.filter(api_token=token), requested, token)
    return theirs.priority


def summary(user: Any) -> dict[str, Any]:
    """What the submission form shows: the user's limits and usage."""
    limits = user_limits(user)
    used = usage(Run.objects.filter(owner_id=user.pk))
    return {
        "active_runs": used.active_runs,
        "active_limit": limits.active_runs,
        "gpu_hours": round(used.gpu_hours, 1),
        "gpu_hours_limit": limits.gpu_hours,
        "priority": limits.priority,
    }
