"""Dispatch, reconcile and stop: the work behind the Celery tasks (``tasks.py``).

- ``dispatch_run(run_id)``: claim a queued run (queued -> dispatched, conditional), issue
  its run-scoped token, ask the executor to submit, store the handle. A redelivered or
  duplicate task finds the run no longer queued and does nothing.
- ``reconcile()``: every beat period. Re-sends dispatch for queued runs whose message was
  lost; fails active runs past their deadline (and stops them); fails active runs whose
  runner ended without reporting, with the exit code and the last lines of its log; stops
  runners of runs that were cancelled.
- ``stop_run(run_id)``: stop the executor of a run that has ended (after cancel).

None of these waits for a benchmark.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token, revoke_token
from portal.benchmarks.models import Run, RunStatus
from portal.benchmarks.services import deadline_for, enqueue_dispatch, transition
from portal.dispatch.executors import (
    ExecutorError,
    ExecutorState,
    ExecutorStatus,
    ExecutorUnavailable,
    get_executor,
)
from portal.lib.logctx import bound_run

log = logging.getLogger(__name__)

# A run token outlives the run's deadline by this much, so a runner's last retries land.
TOKEN_GRACE = timedelta(hours=1)
LOG_LINES_IN_REASON = 15


def dispatch_run(run_id: int) -> str:
    """Claim and submit one run. Returns what happened (for logs and tests):
    ``gone``, ``not-queued``, ``submitted``, ``failed``. Raises ExecutorUnavailable
    (after putting the run back in the queue) so the task retries."""
    run = Run.objects.select_related("owner").filter(pk=run_id).first()
    if run is None:
        return "gone"
    with bound_run(run.public_id):
        now = timezone.now()
        deadline = deadline_for(run, now)
        try:
            executor = get_executor()
        except ExecutorError as exc:
            # QUEUED -> FAILED is not a normal transition: claim first, then fail.
            if transition(run.pk, RunStatus.DISPATCHED, expected=(RunStatus.QUEUED,)):
                transition(run.pk, RunStatus.FAILED, failure_reason=str(exc), finished_at=now)
            return "failed"
        claimed = transition(
            run.pk,
            RunStatus.DISPATCHED,
            expected=(RunStatus.QUEUED,),
            dispatched_at=now,
            deadline=deadline,
            executor=executor.name,
        )
        if not claimed:
            log.info("dispatch: run is no longer queued; nothing to do")
            return "not-queued"
        run.refresh_from_db()
        issued = issue_token(
            run.owner,
            kind=ApiToken.Kind.RUN,
            run=run,
            name=f"runner for {run.short_id}",
            expires_at=deadline + TOKEN_GRACE,
        )
        try:
            handle = executor.submit(run, issued.plaintext)
        except ExecutorUnavailable as exc:
            revoke_token(issued.token)
            transition(
                run.pk,
                RunStatus.QUEUED,
                expected=(RunStatus.DISPATCHED,),
                dispatched_at=None,
                deadline=None,
            )
            log.warning("dispatch: executor unavailable, will retry: %s", exc)
            raise
        except Exception as exc:
            revoke_token(issued.token)
            reason = (
                str(exc)
                if isinstance(exc, ExecutorError)
                else f"internal error while submitting: {exc!r}"
            )
            log.exception("dispatch: submit failed")
            transition(
                run.pk,
                RunStatus.FAILED,
                expected=(RunStatus.DISPATCHED,),
                failure_reason=f"the {executor.name} executor could not start the run: {reason}",
                finished_at=timezone.now(),
            )
            return "failed"
        # Not conditional on the status: the runner may already have reported "started".
        Run.objects.filter(pk=run.pk).update(executor_handle=handle, updated_at=timezone.now())
        log.info("dispatch: submitted to %s: %s", executor.name, handle)
        run.refresh_from_db(fields=["status"])
        if run.is_final:  # cancelled while we were submitting
            executor.cancel(handle)
        return "submitted"


@dataclass
class ReconcileReport:
    """What one reconcile pass did (run public ids), for logs and tests."""

    redispatched: list[str] = field(default_factory=list)
    deadline: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)


def reconcile(now: datetime | None = None) -> ReconcileReport:
    now = now or timezone.now()
    report = ReconcileReport()
    stale = now - timedelta(seconds=settings.SERVEBENCH_REDISPATCH_SECONDS)

    for run in Run.objects.filter(status=RunStatus.QUEUED, updated_at__lt=stale).only(
        "pk", "public_id"
    )[:200]:
        Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(updated_at=now)
        enqueue_dispatch(run.pk)
        report.redispatched.append(run.public_id)

    active = Run.objects.filter(status__in=(RunStatus.DISPATCHED, RunStatus.RUNNING)).defer(
        "errors", "timings"
    )
    for run in active:
        with bound_run(run.public_id):
            try:
                _reconcile_active(run, now, stale, report)
            except ExecutorUnavailable as exc:
                log.warning("reconcile: executor unavailable: %s", exc)
            except Exception:
                log.exception("reconcile: failed on this run; continuing with the others")

    # Runners of recently cancelled runs that are still going (the stop task was lost).
    cancelled = Run.objects.filter(
        status=RunStatus.CANCELLED,
        finished_at__gte=now - timedelta(hours=1),
        executor_handle__isnull=False,
    ).only("pk", "public_id", "executor", "executor_handle")
    for run in cancelled:
        with bound_run(run.public_id):
            try:
                executor = get_executor(run.executor or None)
                if not executor.status(run.executor_handle).ended:
                    executor.cancel(run.executor_handle)
                    report.stopped.append(run.public_id)
            except Exception:
                log.exception("reconcile: could not stop a cancelled run's runner")
    if report.redispatched or report.deadline or report.lost or report.stopped:
        log.info("reconcile: %s", report)
    return report


def _reconcile_active(run: Run, now: datetime, stale: datetime, report: ReconcileReport) -> None:
    executor = get_executor(run.executor or None)
    handle = run.executor_handle
    if run.deadline and now >= run.deadline:
        reason = (
            f"deadline exceeded after {run.timeout_minutes} min (resources.timeout_minutes); "
            "the runner was stopped. Raise the timeout or measure fewer points."
        )
        if handle:
            # A run that never started (no free GPU, image still pulling) says why, since
            # a longer timeout is then not the fix.
            try:
                state = executor.status(handle)
            except ExecutorError:
                state = None
            if state is not None and state.state == ExecutorState.PENDING and state.reason:
                reason = (
                    f"deadline exceeded after {run.timeout_minutes} min before the runner "
                    f"started: {state.reason}"
                )
        if transition(
            run.pk,
            RunStatus.FAILED,
            expected=(RunStatus.DISPATCHED, RunStatus.RUNNING),
            failure_reason=reason,
            finished_at=now,
        ):
            report.deadline.append(run.public_id)
            log.info("reconcile: %s", reason)
            if handle:
                executor.cancel(handle)
        return
    if not handle:
        # Claimed but never submitted: the worker died between the two.
        if (
            run.dispatched_at
            and run.dispatched_at < stale
            and transition(
                run.pk,
                RunStatus.FAILED,
                expected=(RunStatus.DISPATCHED,),
                failure_reason=(
                    "dispatch did not complete (the worker stopped while submitting the "
                    "run); submit it again"
                ),
                finished_at=now,
            )
        ):
            report.lost.append(run.public_id)
        return
    status = executor.status(handle)
    if not status.ended:
        return
    reason = _lost_reason(status, executor.logs(handle, LOG_LINES_IN_REASON))
    if transition(
        run.pk,
        RunStatus.FAILED,
        expected=(RunStatus.DISPATCHED, RunStatus.RUNNING),
        failure_reason=reason,
        finished_at=now,
    ):
        report.lost.append(run.public_id)
        log.info("reconcile: %s", reason.splitlines()[0])


def _lost_reason(status: ExecutorStatus, log_tail: str) -> str:
    if status.exit_code is not None:
        exited = status.reason or f"runner exited with code {status.exit_code}"
        head = f"{exited} without reporting a result"
    elif status.state == ExecutorState.GONE:
        head = f"runner lost: {status.reason or 'the executor no longer knows it'}"
    else:
        # The executor knows why (image pull failed, evicted...): say that, not "lost".
        head = status.reason or "the runner failed without reporting a result"
    tail = log_tail.strip()
    return f"{head}; last lines of its log:\n{tail}" if tail else head


def stop_run(run_id: int) -> bool:
    """Stop the runner of an ended (cancelled, failed) run; False if there was nothing."""
    run = (
        Run.objects.filter(pk=run_id)
        .only("pk", "public_id", "status", "executor", "executor_handle")
        .first()
    )
    if run is None or not run.executor_handle or not run.is_final:
        return False
    with bound_run(run.public_id):
        executor = get_executor(run.executor or None)
        executor.cancel(run.executor_handle)
        log.info("stopped the runner")
    return True
