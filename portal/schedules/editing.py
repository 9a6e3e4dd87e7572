"""Creating, listing, pausing and deleting schedules: the rules the page and the API share.

``create(owner, data)`` takes the API's body (the page builds the same):

    {"name": "nightly H100", "label": "nightly",
     "spec": {...} | "<YAML text>"  or  "preset": "seed",
     "cadence": "daily", "at": "02:30"          # or "cadence": "hours", "every_hours": 4
     "is_public": false, "enabled": true}

The spec is checked now exactly as a submit checks it (``intake.spec_from_request``:
schema, this portal's policy, what the executor can give), and again at every firing
(policies tighten; a refused firing is recorded). A run that alone asks for more
GPU-hours than the owner may use in a day is refused now, since it could never fire.
Errors are ``ScheduleError`` naming the field (a spec's with ``spec.`` in front).
"""

from __future__ import annotations

import re
from datetime import time
from typing import Any

import yaml
from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from portal.accounts import quotas
from portal.benchmarks import baselines, intake, policy
from portal.schedules import cadence as cad
from portal.schedules.models import Cadence, Firing, Schedule
from runners import spec as rs
from runners.choices import choice_message

_AT = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])\Z")
FIELDS = {"name", "label", "spec", "preset", "cadence", "at", "every_hours", "is_public", "enabled"}


class ScheduleError(ValueError):
    """A refused schedule: ``field``, HTTP ``status``, and every problem (``errors``)."""

    def __init__(self, field: str, message: str, status: int = 400, errors: Any = None):
        super().__init__(message)
        self.field = field
        self.status = status
        self.errors = errors or [{"field": field, "message": message}]


def _cadence(data: dict[str, Any]) -> tuple[str, time, int | None]:
    kind = data.get("cadence")
    if kind not in Cadence.values:
        raise ScheduleError("cadence", choice_message(kind, Cadence.values, "cadence"))
    at_text = data.get("at", "00:00")
    match = _AT.match(at_text) if isinstance(at_text, str) else None
    if match is None:
        raise ScheduleError("at", "at is a time of day in UTC, HH:MM (e.g. 02:30)")
    at = time(int(match.group(1)), int(match.group(2)))
    if kind == Cadence.DAILY:
        return kind, at, None
    hours = data.get("every_hours")
    low = settings.SERVEBENCH_SCHEDULE_MIN_HOURS
    if not isinstance(hours, int) or isinstance(hours, bool) or not low <= hours <= cad.MAX_HOURS:
        raise ScheduleError(
            "every_hours",
            f"every_hours is a whole number of hours from {low} (SERVEBENCH_SCHEDULE_MIN_HOURS) "
            f"to {cad.MAX_HOURS}",
        )
    return kind, at, hours


def _spec(owner: Any, data: dict[str, Any]) -> rs.Spec:
    body = {k: data[k] for k in ("spec", "preset") if k in data}
    if isinstance(body.get("spec"), str):  # YAML (or JSON) text, as the form's spec box
        text = body["spec"]
        if len(text) > settings.SERVEBENCH_MAX_SPEC_BYTES:
            raise ScheduleError("spec", "the spec is larger than SERVEBENCH_MAX_SPEC_BYTES")
        try:
            body["spec"] = rs.safe_yaml(text)
        except yaml.YAMLError:
            raise ScheduleError("spec", "the spec is not valid YAML or JSON") from None
    try:
        request = intake.spec_from_request(body, owner)
    except rs.SpecError as exc:
        first = exc.errors[0] if exc.errors else {"field": "spec", "message": str(exc)}
        status = 403 if isinstance(exc, policy.SpecForbidden) else 400
        raise ScheduleError(first["field"] or "spec", str(exc), status, exc.errors) from None
    return request.spec


def create(owner: Any, data: Any) -> Schedule:
    """Store a schedule of ``owner``'s (ScheduleError otherwise); it first fires at its
    next slot."""
    if not isinstance(data, dict):
        raise ScheduleError("", "the body must be a JSON object")
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise ScheduleError(str(unknown[0]), "unknown field")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ScheduleError("name", "name is a string of 1 to 200 characters")
    try:
        label = baselines.validate_label(data.get("label"))
    except baselines.BaselineError as exc:
        raise ScheduleError("label", exc.message) from None
    kind, at, hours = _cadence(data)
    for flag in ("is_public", "enabled"):
        if not isinstance(data.get(flag, False), bool):
            raise ScheduleError(flag, f"{flag} is true or false")
    spec = _spec(owner, data)
    limit = quotas.user_limits(owner).gpu_hours
    needed = quotas.requested_gpu_hours(spec)
    if limit is not None and needed > limit:
        raise ScheduleError(
            "spec.resources.timeout_minutes",
            f"each run may take {needed:g} GPU-hours, more than the {limit} you may use in 24 "
            "hours: it could never run; lower the timeout or the GPU count",
            403,
        )
    count = Schedule.objects.filter(owner=owner).count()
    if count >= settings.SERVEBENCH_SCHEDULES_PER_USER:
        raise ScheduleError(
            "name",
            f"you have {count} schedules, the most one user may keep "
            "(SERVEBENCH_SCHEDULES_PER_USER); delete one first",
            409,
        )
    return Schedule.objects.create(
        owner=owner,
        name=name.strip(),
        spec=spec.model_dump(mode="json"),
        label=label,
        is_public=data.get("is_public", False),
        cadence=kind,
        at_time=at,
        every_hours=hours,
        enabled=data.get("enabled", True),
        next_run_at=cad.next_slot(kind, at, hours, timezone.now()),
    )


def visible(user: Any) -> QuerySet[Schedule]:
    """The user's schedules (staff: everyone's)."""
    found = Schedule.objects.select_related("owner", "last_run")
    return found if user.is_staff or user.is_superuser else found.filter(owner=user)


def get(user: Any, public_id: str) -> Schedule:
    """The schedule ``public_id`` if ``user`` may manage it; DoesNotExist otherwise (a
    stranger's looks the same as none)."""
    return visible(user).get(public_id=public_id)


def set_enabled(schedule: Schedule, enabled: bool) -> Schedule:
    """Pause or resume; a resumed schedule fires at its next slot, never for the slots it
    missed while paused."""
    now = timezone.now()
    fields: dict[str, Any] = {"enabled": enabled}
    if enabled and not schedule.enabled:
        fields["next_run_at"] = cad.next_slot(
            schedule.cadence, schedule.at_time, schedule.every_hours, now
        )
    Schedule.objects.filter(pk=schedule.pk).update(**fields)
    schedule.refresh_from_db()
    return schedule


def history(schedule: Schedule, limit: int = 20) -> QuerySet[Firing]:
    return schedule.firings.select_related("run").order_by("-due_at")[:limit]
