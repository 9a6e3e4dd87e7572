"""Celery tasks: thin wrappers that take ids, re-fetch, and return quietly if the row is gone.

Names are explicit (``servebench.*``) so a rename of this module never strands queued
messages, and the portal's other apps enqueue them by name (``send_task``) without
importing this module. Work lives in ``dispatcher``.

Delivery (settings: ``CELERY_TASK_ACKS_LATE``, ``CELERY_TASK_REJECT_ON_WORKER_LOST``,
``broker_transport_options.visibility_timeout``): a message is acknowledged only after its
task returns, so a task whose worker process dies is delivered again (at once when the
worker's pool child dies; after the visibility timeout when the whole worker dies). Every
task is safe to run twice; the dispatcher's docstring says why.
"""

from __future__ import annotations

from django.conf import settings
from django.db import InterfaceError, OperationalError

from portal.celery import app
from portal.dispatch import dispatcher
from portal.dispatch.executors import ExecutorUnavailable, get_executor
from portal.ops import beat

# While an ended run's runner is still stopping, its slot is not free yet: look again
# this often, this many times (reconcile catches anything later).
RELEASE_POLL_SECONDS = 1.0
RELEASE_POLLS = 60


@app.task(
    name="servebench.dispatch",
    acks_late=True,
    autoretry_for=(ExecutorUnavailable, OperationalError, InterfaceError),
    retry_backoff=5,
    retry_backoff_max=300,
    retry_jitter=True,
    max_retries=12,
)
def dispatch(run_id: int | None = None, polls: int = 0) -> str:
    """Claim queued run ``run_id`` and start it (with slots: fill them, oldest first)."""
    outcome = dispatcher.dispatch_run(run_id)
    executor = get_executor()
    if (
        executor.slots is not None
        and outcome == "waiting"
        and polls < RELEASE_POLLS
        and dispatcher.slot_releasing(executor)
    ):
        dispatch.apply_async(kwargs={"polls": polls + 1}, countdown=RELEASE_POLL_SECONDS)
    return outcome


@app.task(name="servebench.reconcile", acks_late=False, ignore_result=True)
def reconcile() -> dict[str, list[str]]:
    """Beat task (settings.CELERY_BEAT_SCHEDULE): sync executor state, deadlines, lost runners,
    slots. Once per period, however many beats send it (``portal.ops.beat``)."""
    if not beat.first_this_period("reconcile", settings.SERVEBENCH_RECONCILE_SECONDS):
        return {"skipped": ["another beat's reconcile ran this period"]}
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
    """Stop the runner of a cancelled run, then give its slot to the next run."""
    stopped = dispatcher.stop_run(run_id)
    if get_executor().slots is not None:
        dispatch.delay()
    return stopped
