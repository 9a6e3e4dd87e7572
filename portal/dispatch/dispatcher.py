"""Dispatch, reconcile and stop: the work behind the Celery tasks (``tasks.py``).

Every step is safe to repeat and safe to interrupt, because each one leaves a state from
which the next attempt, a redelivered task or the periodic reconcile can carry on:

1. **Claim** (``queued -> dispatched``, a conditional update) stores, in the same
   statement, the executor's handle for the run (``Executor.handle_for``: a work dir or a
   Job name, derived from the run id), the deadline and, for executors with slots, the
   slot. From here on reconcile and cancel can always find the runner, whatever dies.
2. **Start**, under the run's start lock (``_start_lock``: a PostgreSQL advisory lock per
   run, released when the connection ends, so a worker that dies holding it holds
   nothing): decide again, from the row and the executor, whether the run still needs a
   start, then issue the run token and ``Executor.submit`` and record what it returned.
   Deciding and starting under the same lock makes a start idempotent per run: two
   workers, a redelivered task and reconcile may all ask at once, and one runner starts,
   with one token (a token whose start did not happen is revoked). ``submit`` is itself
   idempotent too (the supervisor's lock, the Job's fixed name).
3. **Record** what the start learnt (a pid, a Job uid) in the handle; optional.

A run that was claimed but never started (the worker died between 1 and 2, or the
executor was unavailable) is ``dispatched`` with an executor status of ``not-started``:
a redelivered dispatch task starts it at once, and reconcile re-sends the task once the
claim is ``SERVEBENCH_REDISPATCH_SECONDS`` old. It never fails for a crash of ours; after
``MAX_START_ATTEMPTS`` starts that started nothing, it fails with the runner's log.

**Slots** (executors with ``slots``, i.e. the local one): a benchmark owns its hardware,
so at most ``slots`` runs hold a slot at once. ``fill_slots`` claims queued runs first
come, first served, under a PostgreSQL advisory lock (two workers never both take the last
slot). A run keeps its slot until the executor confirms its runner has exited, not merely
until its status is final: a finished or cancelled runner may still be stopping its
server. Slots are filled on submit, when a run ends, after a cancel, and by reconcile.

- ``dispatch_run(run_id)``: claim and start ``run_id`` (or, with slots, the head of the
  queue), or resume a claimed run that was never started.
- ``reconcile()``: every beat period, for every state: re-sends dispatch for queued runs
  whose message was lost, resumes claimed runs that never started, keeps the deadline of
  runs waiting in the cluster's queue (Kueue) ``timeout_minutes`` away (``hold_deadline``),
  fails active runs past their deadline (and stops them) or whose runner ended without
  reporting (with the exit code and the last lines of its log), stops runners of cancelled
  runs, frees and fills slots.
- ``stop_run(run_id)``: stop the executor of a run that has ended (after cancel).

None of these waits for a benchmark.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token, revoke_token
from portal.benchmarks.lifecycle import deadline_for, enqueue_dispatch, transition
from portal.benchmarks.models import FINAL_STATUSES, Run, RunStatus
from portal.benchmarks.queue import CLAIM_ORDER
from portal.dispatch.executors import (
    Executor,
    ExecutorError,
    ExecutorState,
    ExecutorStatus,
    ExecutorUnavailable,
    get_executor,
)
from portal.lib import failpoints
from portal.lib.logctx import bound_run

log = logging.getLogger(__name__)

# A run token outlives the run's deadline by this much, so a runner's last retries land.
TOKEN_GRACE = timedelta(hours=1)
LOG_LINES_IN_REASON = 15
MAX_START_ATTEMPTS = 5
# The states in which a runner may still hold its slot (or a GPU, or a port).
_ALIVE = (ExecutorState.PENDING, ExecutorState.RUNNING)


def _slot_lock_key(executor: Executor) -> int:
    return zlib.crc32(f"servebench-slots:{executor.name}".encode())


def _handle(run: Run, executor: Executor) -> dict:
    """The stored handle, or the one the executor derives from the run id (older rows)."""
    return run.executor_handle or executor.handle_for(run)


# --------------------------------------------------------------------------- dispatch


def _claim(run_id: int, executor: Executor, now: datetime, slot: int | None = None) -> Run | None:
    """queued -> dispatched, with the handle (and in it the slot's index, which says the
    GPUs and cores the run owns), deadline and slot in the same update."""
    run = Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).first()
    if run is None:
        return None
    handle = executor.handle_for(run)
    if slot is not None:
        handle = {**handle, "slot": slot}
    claimed = transition(
        run.pk,
        RunStatus.DISPATCHED,
        expected=(RunStatus.QUEUED,),
        dispatched_at=now,
        deadline=deadline_for(run, now),
        executor=executor.name,
        executor_handle=handle,
        holds_slot=executor.slots is not None,
    )
    if not claimed:
        return None
    run.refresh_from_db()
    return run


def _never_started(run: Run, executor: Executor) -> bool:
    return executor.status(_handle(run, executor)).state == ExecutorState.NOT_STARTED


# The first key of the two-key advisory locks that guard one run's start (the second is
# the run's pk); the slot lock uses the one-key space, so the two never collide.
_START_LOCK_SPACE = 0x5B57


@contextmanager
def _start_lock(run_pk: int) -> Iterator[bool]:
    """Hold the run's start lock for the block; yields False (held nothing) when another
    worker is starting the run right now. Session-level, so it must not be taken inside
    a transaction that outlives the block; PostgreSQL drops it if the worker dies."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [_START_LOCK_SPACE, run_pk])
        got = bool(cursor.fetchone()[0])
    try:
        yield got
    finally:
        if got:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [_START_LOCK_SPACE, run_pk])


def _start(run: Run, executor: Executor, *, just_claimed: bool = False) -> str:
    """Start a claimed run once: under its start lock, only if it still needs a start.
    ``submitted``, ``failed``, ``starting`` (another worker is starting it now) or
    ``started`` (already started); raises ExecutorUnavailable (the run stays claimed; the
    retry or reconcile starts it).

    Decided again under the lock: a start attempt recorded since ``run`` was read means
    whoever held the lock before us started it. A run this call has just claimed (its
    queued -> dispatched update is ours alone) needs nothing more; a run claimed earlier
    is asked of the executor too (its worker may have died after submitting)."""
    seen = int((run.executor_handle or {}).get("attempts", 0))
    with bound_run(run.public_id), _start_lock(run.pk) as got:
        if not got:
            log.info("dispatch: another worker is starting this run")
            return "starting"
        fresh = Run.objects.select_related("owner").filter(pk=run.pk).first()
        if fresh is None or fresh.status != RunStatus.DISPATCHED:
            return "not-queued"
        attempts = int((fresh.executor_handle or {}).get("attempts", 0))
        if attempts != seen or (not just_claimed and not _never_started(fresh, executor)):
            log.info("dispatch: the run was started already; nothing to do")
            return "started"
        return _submit(fresh, executor)


def _submit(run: Run, executor: Executor) -> str:
    """Issue a token and submit (call under the run's start lock)."""
    failpoints.hit("dispatch.after-claim")
    handle = _handle(run, executor)
    attempts = int(handle.get("attempts", 0)) + 1
    if attempts > MAX_START_ATTEMPTS:
        tail = executor.logs(handle, LOG_LINES_IN_REASON).strip()
        _fail(
            run,
            f"the {executor.name} executor could not start the runner in "
            f"{MAX_START_ATTEMPTS} attempts"
            + (f"; last lines of its log:\n{tail}" if tail else "; it left no log"),
        )
        return "failed"
    Run.objects.filter(pk=run.pk).update(executor_handle={**handle, "attempts": attempts})
    # No runner of this run is alive (decided under the lock): a token issued for an
    # earlier start that never happened (its worker died before submitting) is unused.
    ApiToken.objects.filter(run=run, kind=ApiToken.Kind.RUN, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    issued = issue_token(
        run.owner,
        kind=ApiToken.Kind.RUN,
        run=run,
        name=f"runner for {run.short_id}",
        expires_at=(run.deadline or deadline_for(run, timezone.now())) + TOKEN_GRACE,
    )
    try:
        started = executor.submit(run, issued.plaintext)
    except ExecutorUnavailable as exc:
        revoke_token(issued.token)
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
        _fail(run, f"the {executor.name} executor could not start the run: {reason}")
        return "failed"
    failpoints.hit("dispatch.after-start")
    # Not conditional on the status: the runner may already have reported "started".
    Run.objects.filter(pk=run.pk).update(
        executor_handle={**started, "attempts": attempts}, updated_at=timezone.now()
    )
    log.info("dispatch: submitted to %s: %s", executor.name, started)
    run.refresh_from_db(fields=["status"])
    if run.is_final:  # cancelled while we were submitting
        executor.cancel(started)
    return "submitted"


def _fail(run: Run, reason: str) -> bool:
    return transition(
        run.pk,
        RunStatus.FAILED,
        expected=(RunStatus.DISPATCHED, RunStatus.RUNNING),
        failure_reason=reason,
        finished_at=timezone.now(),
    )


def dispatch_run(run_id: int | None) -> str:
    """Claim and start a run, or resume a claimed run that never started.

    Executors without slots: the run ``run_id``. With slots: the head of the queue (first
    come, first served), ``run_id`` only says why we were called. Returns what happened,
    for logs and tests: ``gone``, ``not-queued``, ``waiting`` (no free slot),
    ``submitted``, ``failed``, ``starting`` (another worker is starting it), ``started``
    (it was started already). Raises ExecutorUnavailable so the task retries.
    """
    try:
        executor = get_executor()
    except ExecutorError as exc:
        run = Run.objects.filter(pk=run_id).first() if run_id else None
        if run is not None and transition(
            run.pk, RunStatus.DISPATCHED, expected=(RunStatus.QUEUED,)
        ):
            _fail(run, str(exc))
            return "failed"
        return "gone" if run is None else "not-queued"
    if run_id is not None and not Run.objects.filter(pk=run_id).exists():
        return "gone"
    if executor.slots is not None:
        outcomes = fill_slots(executor)
        return outcomes.get(run_id, "waiting" if outcomes.get("waiting") else "not-queued")
    run = Run.objects.select_related("owner").filter(pk=run_id).first()
    if run is None:
        return "gone"
    with bound_run(run.public_id):
        failpoints.hit("dispatch.before-claim")
        if run.status == RunStatus.QUEUED:
            claimed = _claim(run.pk, executor, timezone.now())
            if claimed is None:
                return "not-queued"
            return _start(claimed, executor, just_claimed=True)
        if run.status == RunStatus.DISPATCHED and _never_started(run, executor):
            log.info("dispatch: the run was claimed but never started; starting it")
            return _start(run, executor)
        log.info("dispatch: run is %s; nothing to do", run.status)
        return "not-queued"


def release_slots(executor: Executor) -> list[str]:
    """Free the slots of ended runs whose runner has exited (call under the slot lock)."""
    freed = []
    holders = Run.objects.filter(
        holds_slot=True, executor=executor.name, status__in=FINAL_STATUSES
    ).only("pk", "public_id", "executor", "executor_handle")
    for run in holders:
        try:
            state = executor.status(_handle(run, executor)).state
        except ExecutorError as exc:
            log.warning("slots: cannot tell whether %s's runner ended: %s", run.short_id, exc)
            continue
        if state not in _ALIVE:
            Run.objects.filter(pk=run.pk).update(holds_slot=False)
            freed.append(run.public_id)
    return freed


def fill_slots(executor: Executor) -> dict[int | str, str]:
    """Claim queued runs, oldest first, while slots are free; start them, and start any
    claimed run that never started. Returns ``{run pk: outcome}``, plus ``"waiting": "1"``
    when runs are left queued because every slot is held."""
    assert executor.slots is not None
    now = timezone.now()
    outcomes: dict[int | str, str] = {}
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_slot_lock_key(executor)])
        release_slots(executor)
        holders = Run.objects.filter(holds_slot=True, executor=executor.name)
        free_slots = _free_slots(executor.slots, holders)
        free = len(free_slots)
        queued = Run.objects.filter(status=RunStatus.QUEUED).order_by(*CLAIM_ORDER)
        claimed = []
        for pk in queued.values_list("pk", flat=True)[: max(free, 0)]:
            failpoints.hit("dispatch.before-claim")
            run = _claim(pk, executor, now, free_slots[0])
            if run is not None:
                claimed.append(run.pk)
                free_slots.pop(0)
        if queued.exists() and free <= len(claimed):
            outcomes["waiting"] = "1"
        # Claimed earlier (by us now, or by a worker that died before starting them).
        to_start = list(
            holders.filter(status=RunStatus.DISPATCHED).select_related("owner").order_by("pk")
        )
    for run in to_start:
        if run.pk in claimed:
            outcomes[run.pk] = _start(run, executor, just_claimed=True)
        elif _never_started(run, executor):
            outcomes[run.pk] = _start(run, executor)
    return outcomes


def _free_slots(slots: int, holders) -> list[int]:
    """The slot indices no holder has, lowest first. A holder without an index below
    ``slots`` (claimed before slots had indices, or before the slots were lowered) takes
    the lowest free one: its hardware is unknown, so no slot is given out twice."""
    indices = [
        (h or {}).get("slot")
        for h in holders.order_by("pk").values_list("executor_handle", flat=True)
    ]
    used = {i for i in indices if isinstance(i, int) and 0 <= i < slots}
    free = [i for i in range(slots) if i not in used]
    return free[len(indices) - len(used) :]


def slot_releasing(executor: Executor) -> bool:
    """Is a slot held by an ended run whose runner is still stopping?"""
    return Run.objects.filter(
        holds_slot=True, executor=executor.name, status__in=FINAL_STATUSES
    ).exists()


# --------------------------------------------------------------------------- reconcile


@dataclass
class ReconcileReport:
    """What one reconcile pass did (run public ids), for logs and tests."""

    redispatched: list[str] = field(default_factory=list)
    deadline: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)


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
                if executor.status(run.executor_handle).state in _ALIVE:
                    executor.cancel(run.executor_handle)
                    report.stopped.append(run.public_id)
            except Exception:
                log.exception("reconcile: could not stop a cancelled run's runner")

    try:
        executor = get_executor()
    except ExecutorError:
        executor = None
    if executor is not None and executor.slots is not None:
        try:
            outcomes = fill_slots(executor)
        except ExecutorUnavailable as exc:
            log.warning("reconcile: executor unavailable while filling slots: %s", exc)
        else:
            started = [pk for pk, what in outcomes.items() if what == "submitted"]
            report.started = list(
                Run.objects.filter(pk__in=started).values_list("public_id", flat=True)
            )
    if any(vars(report).values()):
        log.info("reconcile: %s", report)
    return report


def _reconcile_active(run: Run, now: datetime, stale: datetime, report: ReconcileReport) -> None:
    executor = get_executor(run.executor or None)
    handle = _handle(run, executor)
    if run.deadline and now >= run.deadline:
        reason = (
            f"deadline exceeded after {run.timeout_minutes} min (resources.timeout_minutes); "
            "the runner was stopped. Raise the timeout or measure fewer points."
        )
        # A run that never started (no free GPU, image still pulling) says why, since
        # a longer timeout is then not the fix.
        try:
            state = executor.status(handle)
        except ExecutorError:
            state = None
        if state is not None and hold_deadline(run, state, now):
            return
        if state is not None and state.state in (ExecutorState.PENDING, ExecutorState.NOT_STARTED):
            why = state.reason or "the runner never started"
            reason = (
                f"deadline exceeded after {run.timeout_minutes} min before the runner "
                f"started: {why}"
            )
        if _fail(run, reason):
            report.deadline.append(run.public_id)
            log.info("reconcile: %s", reason)
            executor.cancel(handle)
        return
    status = executor.status(handle)
    if hold_deadline(run, status, now):
        return
    if status.state == ExecutorState.NOT_STARTED:
        if run.status == RunStatus.RUNNING:
            # It reported "started", so a runner existed: the executor has lost it.
            status = ExecutorStatus(ExecutorState.GONE, reason=status.reason)
        else:
            claimed_at = run.dispatched_at or run.updated_at
            if claimed_at < stale and executor.slots is None:
                # With slots, fill_slots (below in reconcile) starts it under the lock.
                enqueue_dispatch(run.pk)
                report.redispatched.append(run.public_id)
            return
    if not status.ended:
        return
    reason = _lost_reason(status, executor.logs(handle, LOG_LINES_IN_REASON))
    if _fail(run, reason):
        report.lost.append(run.public_id)
        log.info("reconcile: %s", reason.splitlines()[0])


def hold_deadline(run: Run, status: ExecutorStatus, now: datetime) -> bool:
    """While the runner of a dispatched run waits for the cluster's queue to admit it
    (``status.queued_in``: Kueue), that time does not count, as it does not against the
    Job's own deadline: the run's deadline (and its token's expiry) stay
    ``timeout_minutes`` away. True when the run is waiting so (nothing else to do)."""
    if not status.queued_in or run.status != RunStatus.DISPATCHED:
        return False
    deadline = deadline_for(run, now)
    Run.objects.filter(pk=run.pk, status=RunStatus.DISPATCHED).update(deadline=deadline)
    ApiToken.objects.filter(run=run, kind=ApiToken.Kind.RUN, revoked_at__isnull=True).update(
        expires_at=deadline + TOKEN_GRACE
    )
    return True


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
