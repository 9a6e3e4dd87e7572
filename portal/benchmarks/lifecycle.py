"""A run's status changes, and the dispatch work they hand to Celery.

Nothing outside this module writes a Run's status directly: every change goes through
``transition()``, a conditional update, so a second worker, a redelivered task or a late
runner event finds nothing to update (the allowed moves are in ``RunStatus``'s docstring).

- ``transition(run_id, to, expected=...)``: the one status write.
- ``cancel_run(run, by)``: queued/dispatched/running -> cancelled, then stop its runner.
- ``enqueue_dispatch(run_id)``: send the dispatch task after commit.
- ``deadline_for(run, start)``: when a started run has run out of time.
- ``RunFinished``: the run has ended; a runner's report is refused (API: 409).

Dispatch tasks are sent by their Celery name: this app never imports ``portal.dispatch``
(dispatch depends on benchmarks, never the reverse).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from portal.benchmarks.models import ALLOWED_FROM, Run, RunStatus
from portal.benchmarks.sharing import scrub
from portal.lib import broker

log = logging.getLogger(__name__)


class RunFinished(Exception):
    """The run has ended; the runner's report is refused (HTTP 409) so it stops."""

    def __init__(self, run: Run):
        self.run = run
        super().__init__(
            f"run {run.short_id} is {run.status}"
            + (f" ({run.failure_reason})" if run.failure_reason else "")
            + "; it takes no more reports"
        )


def transition(
    run_id: int, to: str, *, expected: tuple[str, ...] | None = None, **fields: Any
) -> bool:
    """Move a run to ``to`` if its status is one of ``expected``; True if it moved.

    ``UPDATE run SET status=<to>, ... WHERE id=<run_id> AND status IN <expected>``: a second
    worker, a redelivered task or a late event finds nothing to update.
    """
    allowed = ALLOWED_FROM[to]
    expected = allowed if expected is None else expected
    if not set(expected) <= set(allowed):
        raise ValueError(
            f"transition to {to} is not allowed from {sorted(set(expected) - set(allowed))}"
        )
    fields.setdefault("updated_at", timezone.now())
    if fields.get("failure_reason"):  # often a log's last lines: stored without credentials
        fields["failure_reason"] = scrub(fields["failure_reason"])
    return Run.objects.filter(pk=run_id, status__in=expected).update(status=to, **fields) == 1


def _send(task: str, args: list[Any], what: str) -> None:
    """Enqueue a dispatch task by its name (this app never imports ``portal.dispatch``).

    If the broker is unreachable or hung the run's state in PostgreSQL is unchanged and
    reconcile does the same work on its next pass, so this only logs
    (``portal.lib.broker``: a couple of seconds at most).
    """
    broker.send(task, args, what)  # bounded: a hung broker never holds up the request


def enqueue_dispatch(run_id: int | None) -> None:
    """Send the dispatch task now (call after commit; see ``intake.create_run``). ``None``:
    fill the executor's free slots from the head of the queue."""
    _send("servebench.dispatch", [run_id], f"dispatch of run id {run_id}")


def cancel_run(run: Run, by: AbstractBaseUser | None = None) -> bool:
    """Cancel an active run and stop its runner. False if it had already ended."""
    reason = f"cancelled by {by}" if by is not None else "cancelled"
    now = timezone.now()
    with transaction.atomic():
        done = transition(run.pk, RunStatus.CANCELLED, failure_reason=reason, finished_at=now)
        if done:
            transaction.on_commit(
                lambda: _send("servebench.stop_execution", [run.pk], f"stop of run id {run.pk}"),
                robust=True,
            )
    if done:
        log.info("run %s %s", run.short_id, reason)
        run.refresh_from_db()
    return done


def deadline_for(run: Run, start: datetime) -> datetime:
    """When a run started at ``start`` has used its ``timeout_minutes``."""
    return start + timedelta(minutes=run.timeout_minutes)
