"""dispatch_run and reconcile, called directly, with real subprocesses and the real broker.

A stand-in script takes the runner's place where the point is how dispatch and reconcile
handle a runner that crashes, hangs or vanishes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from django.conf import settings
from django.utils import timezone

from portal.accounts.models import ApiToken
from portal.benchmarks import ingestion, lifecycle
from portal.benchmarks.models import Run, RunStatus
from portal.dispatch import dispatcher
from portal.dispatch.executors import ExecutorState, ExecutorStatus, get_executor

pytestmark = pytest.mark.django_db


@pytest.fixture
def stand_in(tmp_path, settings):
    """Make SERVEBENCH_RUNNER_PYTHON a script standing in for the runner."""

    def use(body: str) -> str:
        path = tmp_path / "stand-in"
        path.write_text(f"#!{sys.executable}\nimport os, sys, time\n{body}\n")
        path.chmod(0o755)
        settings.SERVEBENCH_RUNNER_PYTHON = str(path)
        settings.SERVEBENCH_DATA_DIR = tmp_path / "data"
        return str(path)

    return use


@pytest.fixture(autouse=True)
def _stop_leftovers():
    yield
    for run in Run.objects.exclude(executor_handle=None):
        get_executor(run.executor).cancel(run.executor_handle)


def queue_length() -> int:
    from portal.celery import app

    with app.connection_for_write() as conn:
        return conn.default_channel.client.llen(settings.CELERY_TASK_DEFAULT_QUEUE)


def wait_ended(run: Run, timeout: float = 60):
    executor = get_executor(run.executor)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = executor.status(run.executor_handle)
        if status.ended:
            return status
        time.sleep(0.1)
    raise AssertionError("the stand-in did not end")


def wait_stopped(run: Run, timeout: float = 60) -> ExecutorStatus:
    """Wait until nothing of the run's runner is left: ended, or never started (a cancel
    can kill a supervisor that was still booting, before it recorded its start)."""
    executor = get_executor(run.executor)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = executor.status(run.executor_handle)
        if status.ended or status.state == ExecutorState.NOT_STARTED:
            return status
        time.sleep(0.1)
    raise AssertionError(f"the stand-in is still there: {status}")


def wait_state(run: Run, state: ExecutorState, timeout: float = 60) -> None:
    executor = get_executor(run.executor)
    deadline = time.monotonic() + timeout
    while executor.status(run.executor_handle).state != state:
        assert time.monotonic() < deadline, executor.status(run.executor_handle)
        time.sleep(0.05)


def test_dispatch_claims_issues_a_run_token_and_submits(make_run, stand_in):
    stand_in("time.sleep(600)")
    run = make_run()
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED
    assert run.executor == "local"
    assert run.dispatched_at and run.deadline
    assert run.deadline - run.dispatched_at == timedelta(minutes=10)
    assert run.holds_slot
    executor = get_executor("local")
    assert run.executor_handle["workdir"] == executor.handle_for(run)["workdir"]
    assert run.executor_handle["attempts"] == 1
    wait_state(run, ExecutorState.RUNNING)
    token = ApiToken.objects.get(run=run)
    assert token.kind == ApiToken.Kind.RUN and token.expires_at > run.deadline


def test_a_redelivered_dispatch_is_harmless(make_run, stand_in):
    stand_in("time.sleep(600)")
    run = make_run()
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    handle = Run.objects.get(pk=run.pk).executor_handle
    assert dispatcher.dispatch_run(run.pk) == "not-queued"
    run.refresh_from_db()
    assert run.executor_handle == handle  # no second runner
    assert ApiToken.objects.filter(run=run).count() == 1
    assert dispatcher.dispatch_run(10**9) == "gone"


def test_a_submit_error_fails_the_run_with_the_reason(make_run, settings):
    settings.SERVEBENCH_RUNNER_PYTHON = "/nonexistent/python"
    run = make_run()
    assert dispatcher.dispatch_run(run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "could not start the run" in run.failure_reason
    assert "SERVEBENCH_RUNNER_PYTHON" in run.failure_reason
    assert all(t.revoked_at for t in ApiToken.objects.filter(run=run))


def test_a_cancel_during_submit_stops_the_runner(make_run, stand_in):
    stand_in("time.sleep(600)")
    run = make_run()
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    run.refresh_from_db()
    lifecycle.cancel_run(run)
    assert dispatcher.stop_run(run.pk)
    wait_stopped(run)


def test_reconcile_fails_a_run_whose_runner_crashed_with_code_and_log(make_run, stand_in):
    stand_in(
        "print('Traceback (most recent call last):')\n"
        "print('RuntimeError: CUDA error')\n"
        "sys.exit(3)"
    )
    run = make_run()
    dispatcher.dispatch_run(run.pk)
    run.refresh_from_db()
    wait_ended(run)
    report = dispatcher.reconcile()
    assert report.lost == [run.public_id]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_reason.startswith(
        "runner exited with code 3 without reporting a result; last lines of its log:"
    )
    assert "RuntimeError: CUDA error" in run.failure_reason
    assert dispatcher.reconcile().lost == []  # once


def test_reconcile_fails_a_killed_runner(make_run, stand_in):
    stand_in("time.sleep(600)")
    run = make_run()
    dispatcher.dispatch_run(run.pk)
    run.refresh_from_db()
    assert dispatcher.reconcile().lost == []  # alive: nothing to do
    wait_state(run, ExecutorState.RUNNING)
    started = json.loads(Path(run.executor_handle["workdir"], "supervisor.json").read_text())
    deadline = time.monotonic() + 10
    while not psutil.Process(started["pid"]).children():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    psutil.Process(started["pid"]).children()[0].send_signal(signal.SIGKILL)  # OOM killer
    wait_ended(run)
    dispatcher.reconcile()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_reason.startswith(
        "runner exited with code 137 (SIGKILL) without reporting a result"
    )


def test_reconcile_calls_a_vanished_runner_lost(make_run, stand_in):
    stand_in("time.sleep(600)")
    run = make_run()
    dispatcher.dispatch_run(run.pk)
    run.refresh_from_db()
    wait_state(run, ExecutorState.RUNNING)
    os.killpg(os.getpgid(run.executor_handle["pid"]), signal.SIGKILL)  # supervisor and all
    wait_ended(run, timeout=60)  # the kernel tears the namespace down; slow when loaded
    dispatcher.reconcile()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_reason.startswith("runner lost: the runner's supervisor was killed")


def test_reconcile_leaves_a_run_that_reported_its_end(make_run, stand_in):
    from runners.result import Event

    stand_in("sys.exit(0)")
    run = make_run()
    dispatcher.dispatch_run(run.pk)
    run.refresh_from_db()
    ingestion.ingest_event(run, Event(type="started", total=3))
    ingestion.ingest_event(run, Event(type="failed", message="no GPU memory left"))
    wait_ended(run)
    assert dispatcher.reconcile().lost == []
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_reason == "no GPU memory left"  # the runner's words, not "lost"


def test_reconcile_fails_a_clean_exit_that_never_reported(make_run, stand_in):
    stand_in("print('wrote result.json only')")
    run = make_run()
    dispatcher.dispatch_run(run.pk)
    run.refresh_from_db()
    wait_ended(run)
    dispatcher.reconcile()
    run.refresh_from_db()
    assert run.failure_reason.startswith(
        "runner exited with code 0 without reporting a result; last lines of its log:"
    )


def test_reconcile_enforces_the_deadline_and_stops_the_runner(make_run, stand_in):
    stand_in("time.sleep(600)")
    run = make_run()
    dispatcher.dispatch_run(run.pk)
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, deadline=timezone.now() - timedelta(seconds=1)
    )
    report = dispatcher.reconcile()
    assert report.deadline == [run.public_id]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_reason.startswith("deadline exceeded after 10 min")
    wait_stopped(run)  # the runner was stopped


def test_reconcile_resends_dispatch_of_a_stale_queued_run(make_run):
    fresh = make_run()
    stale = make_run(updated_at=timezone.now() - timedelta(hours=1))
    before = queue_length()
    report = dispatcher.reconcile()
    assert report.redispatched == [stale.public_id]
    assert queue_length() == before + 1  # a real message on the real broker
    assert fresh.public_id not in report.redispatched
    assert dispatcher.reconcile().redispatched == []  # not again next period


def claimed_never_started(make_run) -> Run:
    """A run as a worker leaves it when it dies between the claim and the start."""
    run = make_run()
    executor = get_executor("local")
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.DISPATCHED,
        dispatched_at=timezone.now() - timedelta(hours=1),
        deadline=timezone.now() + timedelta(minutes=10),
        executor="local",
        executor_handle=executor.handle_for(run),
        holds_slot=True,
    )
    run.refresh_from_db()
    return run


def test_reconcile_starts_a_claim_that_never_started(make_run, stand_in):
    stand_in("time.sleep(600)")
    run = claimed_never_started(make_run)
    assert get_executor("local").status(run.executor_handle).state == ExecutorState.NOT_STARTED
    report = dispatcher.reconcile()
    assert report.started == [run.public_id] and report.lost == []
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED and run.executor_handle["attempts"] == 1
    wait_state(run, ExecutorState.RUNNING)
    assert dispatcher.reconcile().started == []  # started once


def test_a_redelivered_dispatch_starts_a_claim_that_never_started(make_run, stand_in):
    stand_in("time.sleep(600)")
    run = claimed_never_started(make_run)
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    run.refresh_from_db()
    wait_state(run, ExecutorState.RUNNING)
    assert dispatcher.dispatch_run(run.pk) == "not-queued"


def test_a_run_that_never_starts_fails_after_its_attempts_with_the_log(make_run, stand_in):
    stand_in("time.sleep(600)")
    run = claimed_never_started(make_run)
    # Every start "happens" but leaves nothing behind, as if unshare failed each time.
    Run.objects.filter(pk=run.pk).update(
        executor_handle={**run.executor_handle, "attempts": dispatcher.MAX_START_ATTEMPTS}
    )
    dispatcher.reconcile()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert f"could not start the runner in {dispatcher.MAX_START_ATTEMPTS} attempts" in (
        run.failure_reason
    )


def test_reconcile_finds_a_running_run_without_a_handle(make_run, stand_in):
    # An older row (or any gap): the handle is derived from the run id; the runner that
    # reported "started" is nowhere, so the run fails now, not at its deadline.
    run = make_run()
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING,
        executor="local",
        executor_handle=None,
        dispatched_at=timezone.now(),
        deadline=timezone.now() + timedelta(hours=3),
    )
    report = dispatcher.reconcile()
    assert report.lost == [run.public_id]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_reason.startswith("runner lost: no runner was started")


def test_reconcile_stops_a_cancelled_runs_runner(make_run, stand_in):
    stand_in("time.sleep(600)")
    run = make_run()
    dispatcher.dispatch_run(run.pk)
    run.refresh_from_db()
    lifecycle.cancel_run(run)  # its stop task is never delivered in this test
    assert dispatcher.reconcile().stopped == [run.public_id]
    wait_stopped(run)


def test_log_lines_carry_the_runs_short_id(make_run, stand_in):
    import io
    import logging

    from portal.lib.logctx import RunIdFilter

    stand_in("time.sleep(600)")
    run = make_run()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RunIdFilter())
    handler.setFormatter(logging.Formatter(settings.LOGGING["formatters"]["plain"]["format"]))
    logger = logging.getLogger("portal.dispatch.dispatcher")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        dispatcher.dispatch_run(run.pk)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert f"[run={run.public_id[:8]}] dispatch: submitted to local" in stream.getvalue()
