"""The local executor with real subprocesses, real namespaces and real signals.

These tests are about the executor's own process handling (crash, exit codes, kill,
cancel, idempotent submit, isolation), so a few lines of Python stand in for the runner;
the real runner is exercised in test_dispatch_worker.py, test_faults.py and
tests/cli/test_cli_real_runs.py. Each process test runs in both isolation modes:
``namespaces`` (what ``auto`` picks here) and ``none`` (the fallback where unshare is
unavailable).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from portal.dispatch.executors import ExecutorError, ExecutorState
from portal.dispatch.executors.local import LocalExecutor, isolation_prefix, runner_environment

pytestmark = pytest.mark.django_db


@pytest.fixture(params=["namespaces", "none"])
def isolation(request) -> str:
    if request.param == "namespaces":
        return request.getfixturevalue("namespaces")
    return request.param


@pytest.fixture
def stand_in(tmp_path):
    """An executable that takes the runner's place (``python -m runners run ...``)."""

    def make(body: str) -> str:
        path = tmp_path / f"stand-in-{len(list(tmp_path.glob('stand-in-*')))}"
        path.write_text(f"#!{sys.executable}\nimport json, os, signal, sys, time\n{body}\n")
        path.chmod(0o755)
        return str(path)

    return make


def make_executor(tmp_path, python: str, isolation: str) -> LocalExecutor:
    return LocalExecutor(
        python=python, data_dir=tmp_path / "data", stop_grace_seconds=2, isolation=isolation
    )


@pytest.fixture
def executor_for(tmp_path, isolation):
    return lambda python: make_executor(tmp_path, python, isolation)


@pytest.fixture
def namespaces(need) -> str:
    try:
        isolation_prefix("namespaces")
    except ExecutorError as exc:
        need(False, "PID and mount namespaces (unshare)", str(exc))
    return "namespaces"


@pytest.fixture
def handles():
    """Handles to clean up: no stand-in outlives its test."""
    started = []
    yield started
    for executor, handle in started:
        executor.cancel(handle)


# Deadlines are generous: they poll, so a quick machine pays nothing, and a loaded 2-core
# one can take seconds per Python start and per namespace teardown.
def wait_ended(executor, handle, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = executor.status(handle)
        if status.ended:
            return status
        time.sleep(0.1)
    raise AssertionError(f"the process did not end in {timeout} s")


def wait_log(executor, handle, predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = executor.logs(handle, tail=200)
        if predicate(text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"the log never matched; it reads:\n{executor.logs(handle, tail=50)}")


def supervisor_of(handle) -> psutil.Process:
    started = json.loads((Path(handle["workdir"]) / "supervisor.json").read_text())
    return psutil.Process(started["pid"])


def runner_of(handle) -> psutil.Process:
    children = supervisor_of(handle).children()
    assert children, "the supervisor has no runner child"
    return children[0]


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_crashing_runner_reports_its_exit_code_and_log(make_run, stand_in, executor_for, handles):
    executor = executor_for(stand_in("print('loading the model'); sys.exit('boom: no GPU')"))
    run = make_run()
    assert executor.status(executor.handle_for(run)).state == ExecutorState.NOT_STARTED
    handle = executor.submit(run, "sb_run_secret")
    handles.append((executor, handle))
    assert handle["workdir"] == executor.handle_for(run)["workdir"]
    status = wait_ended(executor, handle)
    assert status.state == ExecutorState.FAILED
    assert status.exit_code == 1
    assert status.reason == "runner exited with code 1"
    log = executor.logs(handle, tail=10)
    assert "loading the model" in log and "boom: no GPU" in log
    assert "runner exited with code 1" in executor.logs(handle, tail=1)
    # Liveness and the outcome come from the supervisor's files, so the derived handle,
    # which has no pid, says the same.
    assert executor.status(executor.handle_for(run)) == status


def test_a_clean_exit_is_succeeded(make_run, stand_in, executor_for, handles):
    executor = executor_for(stand_in("print('done')"))
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    status = wait_ended(executor, handle)
    assert (status.state, status.exit_code) == (ExecutorState.SUCCEEDED, 0)


def test_submit_is_idempotent_one_runner_whatever_the_number_of_submits(
    make_run, stand_in, executor_for, handles, tmp_path
):
    marks = tmp_path / "marks"
    marks.mkdir()
    executor = executor_for(
        stand_in(f"open(os.path.join({str(marks)!r}, str(time.time_ns())), 'w')\ntime.sleep(5)")
    )
    run = make_run()
    first = executor.submit(run, "sb_run_a")
    handles.append((executor, first))
    again = [executor.submit(run, f"sb_run_{i}") for i in range(3)]  # while it runs
    wait_ended(executor, first)
    executor.submit(run, "sb_run_after")  # after it ended: still nothing new
    time.sleep(1)
    assert len(list(marks.iterdir())) == 1
    assert all(h["workdir"] == first["workdir"] for h in again)


def test_two_supervisors_started_at_once_run_one_runner(
    make_run, stand_in, executor_for, handles, tmp_path
):
    # Two workers that both saw "not started" start a supervisor each: the lock lets one
    # run the runner; the other leaves without touching the run's files.
    marks = tmp_path / "marks"
    marks.mkdir()
    executor = executor_for(
        stand_in(f"open(os.path.join({str(marks)!r}, str(time.time_ns())), 'w')\ntime.sleep(3)")
    )
    run = make_run()
    first = executor.submit(run, "sb_run_a")
    handles.append((executor, first))
    deadline = time.monotonic() + 10
    while executor.status(first).state != ExecutorState.RUNNING:
        assert time.monotonic() < deadline, executor.logs(first)
        time.sleep(0.05)
    workdir = Path(first["workdir"])
    second = subprocess.run(
        executor.supervisor_argv(run, workdir),
        env=runner_environment("sb_run_b"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert second.returncode == 75, second.stdout + second.stderr
    assert "another supervisor is already running this run" in second.stdout
    status = wait_ended(executor, first)
    assert status.state == ExecutorState.SUCCEEDED, executor.logs(first)
    assert len(list(marks.iterdir())) == 1


def test_the_token_is_in_the_environment_not_argv_and_portal_secrets_are_not(
    make_run, stand_in, executor_for, handles, tmp_path
):
    executor = executor_for(
        stand_in(
            "json.dump({'argv': sys.argv, 'env': dict(os.environ), 'cwd': os.getcwd()},"
            " open('seen.json', 'w'))"
        )
    )
    run = make_run()
    handle = executor.submit(run, "sb_run_the-secret")
    handles.append((executor, handle))
    wait_ended(executor, handle)
    seen = json.loads((Path(handle["workdir"]) / "seen.json").read_text())
    argv = seen["argv"][1:]
    assert argv[:3] == ["-m", "runners", "run"]
    assert argv[3].endswith(f"{run.public_id}/spec.json")
    assert argv[argv.index("--report") + 1] == (
        f"http://testserver/api/v1/runner/runs/{run.public_id}"
    )
    assert argv[argv.index("--out") + 1].endswith("result.json")
    assert not any("sb_run_" in arg for arg in argv)
    assert seen["env"]["SERVEBENCH_RUN_TOKEN"] == "sb_run_the-secret"
    for secret in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"):
        assert secret not in seen["env"]
    assert seen["cwd"] == handle["workdir"]
    spec = json.loads((tmp_path / "data" / "runs" / run.public_id / "spec.json").read_text())
    assert spec == run.spec


def test_with_namespaces_the_runner_sees_only_its_own_processes_and_work_dir(
    make_run, stand_in, namespaces, handles, tmp_path
):
    other = make_run()  # another run's work dir, with a private spec in it
    other_dir = tmp_path / "data" / "runs" / other.public_id
    other_dir.mkdir(parents=True)
    (other_dir / "spec.json").write_text('{"private": true}')
    executor = make_executor(
        tmp_path,
        stand_in(
            "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
            "runs = os.path.dirname(os.getcwd())\n"
            "json.dump({'pid': os.getpid(), 'pids': pids, 'runs': os.listdir(runs),"
            " 'mine': sorted(os.listdir(os.getcwd()))}, open('seen.json', 'w'))"
        ),
        namespaces,
    )
    run = make_run()
    handle = executor.submit(run, "sb_run_x")
    handles.append((executor, handle))
    assert wait_ended(executor, handle).state == ExecutorState.SUCCEEDED, executor.logs(handle)
    seen = json.loads((Path(handle["workdir"]) / "seen.json").read_text())
    assert seen["pid"] == 2  # the supervisor is PID 1 of the run's own namespace
    assert sorted(map(int, seen["pids"])) == [1, 2]
    assert seen["runs"] == [run.public_id]  # not the other run's directory
    assert "spec.json" in seen["mine"] and "runner.log" in seen["mine"]
    assert "isolated: own PID and mount namespaces" in executor.logs(handle, tail=50)


def test_cancel_stops_the_runner_and_what_it_started(make_run, stand_in, executor_for, handles):
    # The stand-in starts a child in a session of its own, as the runner starts a server.
    executor = executor_for(
        stand_in(
            "import subprocess\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
            " start_new_session=True)\n"
            "print('child started', flush=True)\n"
            "time.sleep(600)"
        )
    )
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    wait_log(executor, handle, lambda t: "child started" in t)
    runner = runner_of(handle)
    everything = [runner, *runner.children(recursive=True)]
    assert len(everything) == 2
    assert executor.status(handle).state == ExecutorState.RUNNING
    executor.cancel(handle)
    status = wait_ended(executor, handle)
    assert status.state in (ExecutorState.FAILED, ExecutorState.GONE)
    assert all(gone(p.pid) for p in everything)
    executor.cancel(handle)  # idempotent


def test_cancel_escalates_to_sigkill_when_the_runner_ignores_sigterm(
    make_run, stand_in, executor_for, handles
):
    executor = executor_for(
        stand_in(
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
            "time.sleep(600)"
        )
    )
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    wait_log(executor, handle, lambda t: "ready" in t)
    runner = runner_of(handle)
    started = time.monotonic()
    executor.cancel(handle)
    # Returns after the grace period's SIGKILL, not after the runner's 600 s sleep.
    assert time.monotonic() - started < 120
    status = wait_ended(executor, handle)
    assert status.ended
    assert gone(runner.pid)


def test_a_killed_runner_takes_its_server_with_it_and_reports_its_signal(
    make_run, stand_in, executor_for, handles
):
    # The runner killed by the OOM killer: nothing runs its cleanup, yet its "server" (a
    # child in a session of its own, like vLLM's) and the server's own child must go.
    executor = executor_for(
        stand_in(
            "import subprocess\n"
            "code = 'import subprocess, sys, time; "
            'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]); '
            "time.sleep(600)'\n"
            "server = subprocess.Popen([sys.executable, '-c', code], start_new_session=True)\n"
            "print('server up', flush=True)\ntime.sleep(600)"
        )
    )
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    wait_log(executor, handle, lambda t: "server up" in t)
    runner = runner_of(handle)
    deadline = time.monotonic() + 60
    while len(left := runner.children(recursive=True)) < 2:
        assert time.monotonic() < deadline, f"the server and its child did not start: {left}"
        time.sleep(0.1)
    runner.send_signal(signal.SIGKILL)
    status = wait_ended(executor, handle)
    assert status.state == ExecutorState.FAILED
    assert status.exit_code == 137
    assert status.reason == "runner exited with code 137 (SIGKILL)"
    assert all(gone(p.pid) for p in left), "the runner's server outlived it"
    assert "left behind" in executor.logs(handle, tail=20)


def test_cancel_never_signals_a_process_that_is_not_ours(make_run, stand_in, executor_for, handles):
    executor = executor_for(stand_in("time.sleep(600)"))
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    started_file = Path(handle["workdir"]) / "supervisor.json"
    deadline = time.monotonic() + 60
    # Running means the supervisor holds the lock and has written its start record,
    # which this test rewrites; isolated, it writes the record again once in its
    # namespaces, and only then starts the runner: so wait for the runner too.
    while executor.status(handle).state != ExecutorState.RUNNING or not (
        supervisor_of(handle).children()
    ):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    supervisor = supervisor_of(handle)
    started = json.loads(started_file.read_text())
    # A recycled pid: the recorded start time no longer matches the live process.
    started_file.write_text(json.dumps({**started, "start_time": started["start_time"] - 1}))
    executor.cancel({**handle, "pid": None})
    assert supervisor.is_running() and executor.status(handle).state == ExecutorState.RUNNING
    started_file.write_text(json.dumps(started))


def test_a_missing_interpreter_is_a_clear_error(make_run, executor_for):
    executor = executor_for("/nonexistent/python3")
    with pytest.raises(ExecutorError, match="SERVEBENCH_RUNNER_PYTHON"):
        executor.submit(make_run(), "sb_run_x")


def test_a_supervisor_killed_with_its_runner_is_gone_not_failed(
    make_run, stand_in, executor_for, handles
):
    executor = executor_for(stand_in("print('ready', flush=True)\ntime.sleep(600)"))
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    wait_log(executor, handle, lambda t: "ready" in t)
    supervisor = supervisor_of(handle)
    runner = runner_of(handle)
    os.killpg(os.getpgid(supervisor.pid), signal.SIGKILL)  # the whole group, at once
    status = wait_ended(executor, handle)
    assert status.state == ExecutorState.GONE
    assert "supervisor was killed" in status.reason
    with contextlib.suppress(psutil.NoSuchProcess):
        runner.wait(timeout=60)
    assert gone(runner.pid)


def test_a_supervisor_killed_before_it_recorded_its_start_leaves_the_run_startable(
    make_run, stand_in, tmp_path, handles
):
    # The supervisor takes the run's lock, then writes its start record. Killed between
    # the two, no runner ever ran: the run must read "starting", then "not started" (so
    # dispatch starts it), never "running" or "lost". The test holds the lock as that
    # supervisor would.
    import fcntl

    executor = make_executor(tmp_path, stand_in("print('ran', flush=True)"), "none")
    run = make_run()
    handle = executor.handle_for(run)
    workdir = Path(handle["workdir"])
    workdir.mkdir(parents=True)
    with (workdir / "supervisor.lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        status = executor.status(handle)
        assert status.state == ExecutorState.PENDING and not status.ended, status
        assert executor.submit(run, "sb_run_x") == handle  # a starting runner is left alone
    assert executor.status(handle).state == ExecutorState.NOT_STARTED  # the lock died with it
    started = executor.submit(run, "sb_run_x")
    handles.append((executor, started))
    status = wait_ended(executor, started)
    assert status.state == ExecutorState.SUCCEEDED, executor.logs(started)
    assert "ran" in executor.logs(started)
