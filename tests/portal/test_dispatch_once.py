"""One start per run, however many ask at once (``dispatcher._start``'s start lock).

Real PostgreSQL (advisory locks, one connection per thread), the real local executor,
``unshare`` and supervisor; a stand-in script takes the runner's place. The fault window:
the runs to start were read under the slot lock and started after it, so a second worker
could start a run the first was starting (3 of 19 dispatches in a field test): a second
token stayed valid and its ``unshare`` stayed behind as a zombie.
"""

from __future__ import annotations

import sys
import time

import psutil
import psycopg
import pytest
from django.db import connection
from racing import at_once

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.benchmarks.models import Run, RunStatus
from portal.dispatch import dispatcher
from portal.dispatch.executors import ExecutorState, get_executor

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


@pytest.fixture
def stand_in(tmp_path, settings):
    """A runner that records each start in marks/ and then waits to be stopped."""
    marks = tmp_path / "marks"
    marks.mkdir()
    path = tmp_path / "stand-in"
    path.write_text(
        f"#!{sys.executable}\nimport os, time\n"
        f"open(os.path.join({str(marks)!r}, str(os.getpid())), 'w').close()\n"
        "time.sleep(600)\n"
    )
    path.chmod(0o755)
    settings.SERVEBENCH_RUNNER_PYTHON = str(path)
    settings.SERVEBENCH_DATA_DIR = tmp_path / "data"
    settings.SERVEBENCH_LOCAL_SLOTS = 1
    yield marks
    for run in Run.objects.exclude(executor_handle=None):
        get_executor(run.executor).cancel(run.executor_handle)


def active_tokens(run: Run) -> int:
    return ApiToken.objects.filter(run=run, revoked_at__isnull=True).count()


def zombies() -> list[int]:
    """This process's children that exited and were never reaped."""
    return [kid.pid for kid in psutil.Process().children() if kid.status() == psutil.STATUS_ZOMBIE]


def wait_running(run: Run, marks, timeout: float = 60) -> None:
    executor = get_executor("local")
    deadline = time.monotonic() + timeout
    while executor.status(run.executor_handle).state != ExecutorState.RUNNING or not any(
        marks.iterdir()
    ):
        assert time.monotonic() < deadline, executor.status(run.executor_handle)
        time.sleep(0.05)
        run.refresh_from_db()


def test_eight_workers_dispatching_at_once_start_one_runner_with_one_token(make_run, stand_in):
    run = make_run()
    outcomes = at_once(lambda: dispatcher.dispatch_run(run.pk), 8)
    assert outcomes.count("submitted") == 1, outcomes
    assert all(o in ("submitted", "starting", "started", "not-queued") for o in outcomes)
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED and run.executor_handle["attempts"] == 1
    wait_running(run, stand_in)
    # Later dispatches (reconcile, a redelivered task) start nothing either.
    for _ in range(3):
        assert dispatcher.dispatch_run(run.pk) in ("not-queued", "started")
    time.sleep(1)
    assert len(list(stand_in.iterdir())) == 1
    assert ApiToken.objects.filter(run=run).count() == active_tokens(run) == 1


def test_a_run_being_started_elsewhere_is_left_to_that_worker(make_run, stand_in):
    run = make_run()
    assert dispatcher._claim(run.pk, get_executor("local"), run.created_at) is not None
    # Another worker holds the run's start lock (its own connection, as a worker has).
    other = psycopg.connect(_dsn(), autocommit=True)
    try:
        other.execute("SELECT pg_advisory_lock(%s, %s)", [dispatcher._START_LOCK_SPACE, run.pk])
        assert dispatcher.dispatch_run(run.pk) == "starting"
        assert ApiToken.objects.filter(run=run).count() == 0  # no token for a start not made
    finally:
        other.close()  # the worker died: PostgreSQL drops its lock with the connection
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    wait_running(run, stand_in)
    assert len(list(stand_in.iterdir())) == 1


def test_a_token_from_a_start_that_never_happened_is_revoked(make_run, stand_in):
    run = make_run()
    claimed = dispatcher._claim(run.pk, get_executor("local"), run.created_at)
    assert claimed is not None
    # A worker issued a token and died before it submitted: nothing uses that token.
    orphan = issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run).token
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    orphan.refresh_from_db()
    assert orphan.revoked_at is not None
    assert active_tokens(run) == 1


def test_the_worker_reaps_what_it_started(make_run, stand_in):
    run = make_run()
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    run.refresh_from_db()
    wait_running(run, stand_in)
    get_executor("local").cancel(run.executor_handle)
    deadline = time.monotonic() + 30
    while psutil.pid_exists(run.executor_handle["pid"]):
        assert time.monotonic() < deadline, "the started process was never reaped"
        time.sleep(0.1)
    assert run.executor_handle["pid"] not in zombies()


def _dsn() -> str:
    db = connection.settings_dict
    return psycopg.conninfo.make_conninfo(
        dbname=db["NAME"],
        user=db["USER"] or None,
        host=db["HOST"] or None,
        port=db["PORT"] or None,
        password=db["PASSWORD"] or None,
    )
