"""What a run page says about where the run came from and what of it is gone: the
schedule that submitted it (``portal.schedules``) and the parts retention deleted
(``portal.ops.retention``, read from the run's own columns). No query for a run no
schedule made."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from portal.benchmarks import queries
from portal.benchmarks.models import Run
from portal.ops import retention
from portal.schedules.models import Schedule


def notes(user: Any, run: Run) -> list[dict[str, str]]:
    """``[{"id", "text", "url"}]``: the schedule that submitted the run (its page linked
    for who manages the run; one query, only for a scheduled run), then one line per
    expired part ("Per-request samples expired on DATE (retention N days).")."""
    out = []
    schedule = Schedule.objects.filter(pk=run.schedule_id).first() if run.schedule_id else None
    if schedule is not None:
        manager = queries.may_manage(user, run)
        out.append(
            {
                "id": "made-by-schedule",
                "text": (
                    f"Submitted by the schedule {schedule.name!r} ({schedule.describe()}), "
                    f"labelled {schedule.label!r}."
                ),
                "url": reverse("web:schedule", args=[schedule.public_id]) if manager else "",
            }
        )
    for i, text in enumerate(retention.notes(run)):
        out.append({"id": f"expired-{i}", "text": text, "url": ""})
    return out
