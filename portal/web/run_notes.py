"""What a run page says about where the run came from and what of it is gone: the
schedule that submitted it (``portal.schedules``) and the parts retention deleted
(``portal.ops.retention``). Two small queries; none for a run with neither."""

from __future__ import annotations

from typing import Any

from django.urls import reverse

from portal.benchmarks import queries
from portal.benchmarks.models import Run
from portal.ops import retention
from portal.schedules.editing import made_by


def notes(user: Any, run: Run) -> list[dict[str, str]]:
    """``[{"id", "text", "url"}]``: the schedule (its page linked for who manages the run),
    then one line per expired part ("Per-request samples expired on DATE (retention N
    days).")."""
    out = []
    firing = made_by(run)
    if firing is not None:
        schedule = firing.schedule
        manager = queries.may_manage(user, run)
        out.append(
            {
                "id": "made-by-schedule",
                "text": (
                    f"Submitted by the schedule {schedule.name!r} ({schedule.describe()}) for "
                    f"{firing.due_at:%Y-%m-%d %H:%M} UTC, labelled {schedule.label!r}."
                ),
                "url": reverse("web:schedule", args=[schedule.public_id]) if manager else "",
            }
        )
    for i, text in enumerate(retention.notes(run)):
        out.append({"id": f"expired-{i}", "text": text, "url": ""})
    return out
