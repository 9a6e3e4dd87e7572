"""The local executor with real subprocesses.

These tests are about the executor's own process handling (crash, exit codes, kill,
cancel, pid reuse), so a few lines of Python stand in for the runner; the real runner is
exercised in test_dispatch_worker.py and test_end_to_end.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

import psutil
import pytest

from portal.dispatch.executors import ExecutorError, ExecutorState
from portal.dispatch.executors.local import LocalExecutor

pytestmark = pytest.mark.django_db


@pytest.fixture
def stand_in(tmp_path):
    """An executable that takes the runner's place (``python -m runners run ...``)."""

    def make(body: str) -> str:
        path = tmp_path / f"stand-in-{len(list(tmp_path.glob('stand-in-*')))}"
        path.write_text(f"#!{sys.executable}\nimport json, os, signal, sys, time\n{body}\n")
        path.chmod(0o755)
        return str(path)

    return make


@pytest.fixture
def executor_for(tmp_path):
    made = []

    def make(python: str) -> LocalExecutor:
        executor = LocalExecutor(python=python, data_dir=tmp_path / "data", stop_grace_seconds=2)
        made.append(executor)
        return executor

    yield make


@pytest.fixture
def handles():
    """Handles to clean up: no stand-in outlives its test."""
    started = []
    yield started
    for executor, handle in started:
        executor.cancel(handle)


def wait_ended(executor, handle, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = executor.status(handle)
        if status.ended:
            return status
        time.sleep(0.1)
    raise AssertionError(f"the process did not end in {timeout} s")


def test_a_crashing_runner_reports_its_exit_code_and_log(make_run, stand_in, executor_for, handles):
    executor = executor_for(stand_in("print('loading the model'); sys.exit('boom: no GPU')"))
    run = make_run()
    handle = executor.submit(run, "sb_run_secret")
    handles.append((executor, handle))
    assert set(handle) >= {"pid", "pgid", "workdir", "started"}
    status = wait_ended(executor, handle)
    assert status.state == ExecutorState.FAILED
    assert status.exit_code == 1
    assert status.reason == "runner exited with code 1"
    log = executor.logs(handle, tail=5)
    assert "loading the model" in log and "boom: no GPU" in log
    assert "runner exited with code 1" in executor.logs(handle, tail=1)


def test_a_clean_exit_is_succeeded(make_run, stand_in, executor_for, handles):
    executor = executor_for(stand_in("print('done')"))
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    status = wait_ended(executor, handle)
    assert (status.state, status.exit_code) == (ExecutorState.SUCCEEDED, 0)


def test_the_token_is_in_the_environment_not_argv_and_portal_secrets_are_not(
    make_run, stand_in, executor_for, handles, tmp_path
):
    out = tmp_path / "seen.json"
    executor = executor_for(
        stand_in(
            f"json.dump({{'argv': sys.argv, 'env': dict(os.environ), 'cwd': os.getcwd()}}, "
            f"open({str(out)!r}, 'w'))"
        )
    )
    run = make_run()
    handle = executor.submit(run, "sb_run_the-secret")
    handles.append((executor, handle))
    wait_ended(executor, handle)
    seen = json.loads(out.read_text())
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


def test_it_runs_in_its_own_process_group_and_cancel_stops_it(
    make_run, stand_in, executor_for, handles
):
    # The stand-in starts a child of its own, as the runner starts a vLLM server.
    executor = executor_for(
        stand_in(
            "import subprocess\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "print('child', child.pid, flush=True)\n"
            "time.sleep(600)"
        )
    )
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    assert os.getpgid(handle["pid"]) == handle["pgid"] != os.getpgid(0)
    deadline = time.monotonic() + 10
    while "child" not in executor.logs(handle) and time.monotonic() < deadline:
        time.sleep(0.1)
    child_pid = int(executor.logs(handle).split("child ")[1].split()[0])
    assert executor.status(handle).state == ExecutorState.RUNNING
    executor.cancel(handle)
    status = wait_ended(executor, handle, timeout=10)
    assert status.state in (ExecutorState.FAILED, ExecutorState.GONE)
    assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == "zombie"
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
    deadline = time.monotonic() + 10
    while "ready" not in executor.logs(handle) and time.monotonic() < deadline:
        time.sleep(0.1)
    started = time.monotonic()
    executor.cancel(handle)
    assert time.monotonic() - started < 10
    status = wait_ended(executor, handle, timeout=10)
    assert status.state == ExecutorState.GONE  # the supervisor was SIGKILLed with it
    assert "no exit code" in status.reason


def test_a_runner_killed_before_its_cleanup_takes_its_server_with_it(
    make_run, stand_in, executor_for, handles
):
    # Like the real runner, the stand-in starts its "server" in a session of its own, and
    # like a runner stuck in cleanup, it ignores SIGTERM until the grace runs out.
    executor = executor_for(
        stand_in(
            "import subprocess\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "server = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
            " start_new_session=True)\n"
            "print(server.pid, flush=True)\ntime.sleep(600)"
        )
    )
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        lines = executor.logs(handle).strip().splitlines()
        if lines and lines[-1].isdigit():
            break
        time.sleep(0.1)
    server = psutil.Process(int(executor.logs(handle).strip().splitlines()[-1]))
    executor.cancel(handle)
    with contextlib.suppress(psutil.TimeoutExpired):
        server.wait(timeout=10)
    gone = not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    assert gone, "the runner's server outlived the cancel"


def test_a_killed_runner_is_reported_with_its_signal(make_run, stand_in, executor_for, handles):
    executor = executor_for(stand_in("print(os.getpid(), flush=True)\ntime.sleep(600)"))
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    deadline = time.monotonic() + 10
    while not executor.logs(handle).splitlines()[1:] and time.monotonic() < deadline:
        time.sleep(0.1)
    runner_pid = int(executor.logs(handle).splitlines()[-1])
    os.kill(runner_pid, signal.SIGKILL)  # the OOM killer, say
    status = wait_ended(executor, handle)
    assert status.state == ExecutorState.FAILED
    assert status.exit_code == 137
    assert status.reason == "runner exited with code 137 (SIGKILL)"


def test_a_recycled_pid_is_not_mistaken_for_the_runner(make_run, stand_in, executor_for, handles):
    executor = executor_for(stand_in("time.sleep(600)"))
    handle = executor.submit(make_run(), "sb_run_x")
    handles.append((executor, handle))
    assert executor.status(handle).state == ExecutorState.RUNNING
    impostor = {**handle, "started": handle["started"] - 3600}
    assert executor.status(impostor).state == ExecutorState.GONE
    executor.cancel(impostor)  # must not signal a process that is not ours
    assert executor.status(handle).state == ExecutorState.RUNNING


def test_a_missing_interpreter_is_a_clear_error(make_run, executor_for):
    executor = executor_for("/nonexistent/python3")
    with pytest.raises(ExecutorError, match="SERVEBENCH_RUNNER_PYTHON"):
        executor.submit(make_run(), "sb_run_x")
