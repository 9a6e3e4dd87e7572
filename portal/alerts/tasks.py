"""Alerts' Celery tasks, enqueued by name (``servebench.alerts.*``): the scan (beat, every
minute: ``settings.CELERY_BEAT_SCHEDULE["alerts"]``) and one delivery's try, retried with
backoff and jitter (``delivery.backoff``). Both are safe to run twice: a check is unique
per run and label, and a try takes its delivery with a conditional update."""

from __future__ import annotations

from django.conf import settings
from django.db import InterfaceError, OperationalError

from portal.alerts import delivery, evaluate
from portal.celery import app
from portal.ops import beat


@app.task(name="servebench.alerts.scan", acks_late=False, ignore_result=True)
def scan() -> dict[str, list[str]]:
    """Judge labelled runs that succeeded since the last scan; re-send lost deliveries
    (once per period: ``portal.ops.beat``)."""
    if not beat.first_this_period("alerts", settings.SERVEBENCH_TICK_SECONDS):
        return {"skipped": ["another beat's scan ran this period"]}
    return evaluate.scan()


@app.task(
    name="servebench.alerts.deliver",
    bind=True,
    acks_late=True,
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=5,
    retry_jitter=True,
    max_retries=None,
)
def deliver(self, delivery_id: str) -> str:
    """One try of a delivery; a transient failure retries after its backoff."""
    try:
        return delivery.attempt(delivery_id)
    except delivery.Retry as wait:
        raise self.retry(countdown=wait.delay, max_retries=None) from None
