"""The operations' Celery task: retention (``portal.ops.retention``), daily from beat
(``settings.CELERY_BEAT_SCHEDULE["retention"]``). Safe to run twice at once."""

from __future__ import annotations

from portal.celery import app
from portal.ops import retention


@app.task(name="servebench.retention", acks_late=False, ignore_result=True)
def purge_expired() -> dict[str, list[str]]:
    """Delete expired samples, telemetry and logs; the runs touched, per kind."""
    return vars(retention.purge())
