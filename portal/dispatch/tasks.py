"""Celery tasks: thin wrappers that take ids, re-fetch, and return quietly if the row is gone.

Names are explicit (``servebench.*``) so a rename of this module never strands queued
messages. Work lives in ``dispatcher``.
"""

from __future__ import annotations

from django.db import InterfaceError, OperationalError

from portal.celery import app
from portal.dispatch import dispatcher
from portal.dispatch.executors import ExecutorUnavailable


@app.task(
    name="servebench.dispatch",
    acks_late=True,
    autoretry_for=(ExecutorUnavailable, OperationalError, InterfaceError),
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=12,
)
def dispatch(run_id: int) -> str:
    """Claim queued run ``run_id`` and submit it to the executor."""
    return dispatcher.dispatch_run(run_id)


@app.task(name="servebench.reconcile", acks_late=False, ignore_result=True)
def reconcile() -> dict[str, list[str]]:
    """Beat task (settings.CELERY_BEAT_SCHEDULE): sync executor state, deadlines, lost runners."""
    return vars(dispatcher.reconcile())


@app.task(
    name="servebench.stop_execution",
    acks_late=True,
    autoretry_for=(ExecutorUnavailable, OperationalError, InterfaceError),
    retry_backoff=2,
    retry_jitter=True,
    max_retries=5,
)
def stop_execution(run_id: int) -> bool:
    """Stop the runner of a cancelled run."""
    return dispatcher.stop_run(run_id)
