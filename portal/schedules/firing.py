"""The beat tick: due schedules submit their runs, once per slot, whatever runs twice.

``tick(now)`` (the task ``servebench.schedules.tick``, every minute) takes each enabled
schedule whose ``next_run_at`` has come and, in one transaction:

1. **claims** the slot: ``UPDATE ... SET next_run_at = <next slot> WHERE id = %s AND
   enabled AND next_run_at = <the slot it read>``. A second beat, a redelivered tick or
   two workers find nothing to update and move on; the ``Firing`` row is unique per
   (schedule, slot) besides.
2. **submits** the run through the normal intake (``intake.create_run``: the spec is
   checked against today's policy, fair use applies, the owner's priority) and labels it
   into the series (``baselines.mark``), so its history and alerts follow.
3. **records** the firing: the run, or the refusal (a spec the policy no longer accepts,
   a quota reached), on the ``Firing`` and on the schedule (``last_error``); a refusal
   notifies the series' subscribers (``portal.alerts.evaluate.notify``).

A crash before the commit leaves the schedule due, and the next tick fires it; after the
commit, the run exists and its dispatch is enqueued (reconcile re-sends a lost one).
Slots missed while beat was down fire once, at the next tick.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.accounts.quotas import QuotaExceeded
from portal.alerts.evaluate import notify
from portal.benchmarks import baselines, intake
from portal.benchmarks.models import Run
from portal.schedules import cadence
from portal.schedules.models import Firing, Schedule
from runners import spec as rs

log = logging.getLogger(__name__)

BATCH = 50


def _refused(schedule: Schedule, due: datetime, reason: str) -> None:
    notify(
        schedule.owner,
        schedule.label,
        "",
        "schedule_refused",
        f"schedule:{schedule.pk}:{due.isoformat()}",
        {
            "event": "schedule_refused",
            "text": (
                f"servebench: schedule {schedule.name!r} ({schedule.describe()}) could not "
                f"submit its run due {due:%Y-%m-%d %H:%M} UTC: {reason}"
            ),
            "series": {"owner": schedule.owner.get_username(), "label": schedule.label},
            "schedule": {"id": schedule.public_id, "name": schedule.name},
            "due_at": due.isoformat(),
            "reason": reason,
        },
    )


def fire(schedule: Schedule, now: datetime) -> Firing | None:
    """Claim ``schedule``'s due slot and submit its run; None if another tick claimed it."""
    due = schedule.next_run_at
    following = cadence.next_slot(schedule.cadence, schedule.at_time, schedule.every_hours, now)
    with transaction.atomic():
        claimed = Schedule.objects.filter(pk=schedule.pk, enabled=True, next_run_at=due).update(
            next_run_at=following, last_fired_at=now
        )
        if not claimed:
            return None
        name = f"{schedule.name} ({due:%Y-%m-%d %H:%M} UTC)"
        run, refusal = None, ""
        try:
            with transaction.atomic():
                run = intake.create_run(
                    schedule.owner, schedule.spec, name, is_public=schedule.is_public
                )
                Run.objects.filter(pk=run.pk).update(schedule=schedule)
                baselines.mark(run, schedule.owner, schedule.label)
        except QuotaExceeded as exc:
            refusal = f"fair use: {exc}"
        except rs.SpecError as exc:
            refusal = f"the spec is not accepted any more: {exc}"
        firing = Firing.objects.create(schedule=schedule, due_at=due, run=run, refusal=refusal)
        Schedule.objects.filter(pk=schedule.pk).update(last_run=run, last_error=refusal)
        if refusal:
            _refused(schedule, due, refusal)
    if refusal:
        log.info("schedule %s: refused at %s: %s", schedule.public_id[:8], due, refusal)
    else:
        log.info("schedule %s: submitted run %s", schedule.public_id[:8], run.short_id)
    return firing


def tick(now: datetime | None = None) -> dict[str, Any]:
    """Fire every due schedule (oldest slot first); what was submitted and refused."""
    now = now or timezone.now()
    due = (
        Schedule.objects.filter(enabled=True, next_run_at__lte=now)
        .select_related("owner")
        .order_by("next_run_at", "pk")[:BATCH]
    )
    report: dict[str, Any] = {"submitted": [], "refused": []}
    for schedule in due:
        try:
            firing = fire(schedule, now)
        except Exception:  # one schedule's bug must not stop the others; it stays due
            log.exception("schedule %s: could not fire", schedule.public_id[:8])
            continue
        if firing is None:
            continue
        if firing.run is not None:
            report["submitted"].append(firing.run.public_id)
        else:
            report["refused"].append(schedule.public_id)
    return report
