"""Schedules' Celery task: the beat tick (``settings.CELERY_BEAT_SCHEDULE["schedules"]``,
every minute). Two beats, or a redelivered tick, submit each slot once
(``portal.schedules.firing``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from portal.celery import app
from portal.ops import beat
from portal.schedules import firing


@app.task(name="servebench.schedules.tick", acks_late=False, ignore_result=True)
def tick() -> dict[str, Any]:
    """Submit the runs of every due schedule (once per period: ``portal.ops.beat``)."""
    if not beat.first_this_period("schedules", settings.SERVEBENCH_TICK_SECONDS):
        return {"skipped": True}
    return firing.tick()
