"""A runner's children die with it, however it dies (``runners.procs`` + ``runners.groupwatch``).

Real processes and real signals: a stand-in for the runner (a Python process that spawns
children through ``runners.procs`` exactly as the runner does) and the real
``python -m runners run`` CLI with an HF baseline on the tiny model.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from runners import procs
from runners.runner import ExitCode
from runners.spec import parse_spec

# A leader that forks a worker (like vLLM's API server and its engine process); the worker
# ignores SIGTERM, as a busy engine may, so only SIGKILL ends it.
FAMILY = textwrap.dedent(
    """
    import os, signal, sys, time
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(1)
    print(pid, flush=True)
    while True:
        time.sleep(1)
    """
)

# The runner's stand-in: spawns FAMILY through runners.procs, prints the leader's pid.
STAND_IN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from runners import procs
    proc = procs.spawn([sys.executable, "-c", sys.argv[1]], Path(sys.argv[2]), procs.python_env())
    print(proc.pid, flush=True)
    time.sleep(3600)
    """
)


def wait_gone(pids: list[int], timeout_s: float) -> float:
    """Seconds until every pid is gone (or a zombie); fails after ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"still running after {timeout_s} s: {alive}")


def worker_of(log: Path, timeout_s: float = 20) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = log.read_text().split() if log.exists() else []
        if lines and lines[-1].isdigit():
            return int(lines[-1])
        time.sleep(0.1)
    raise AssertionError(f"the family did not start: {log.read_text() if log.exists() else ''}")


def test_a_runner_killed_by_sigkill_takes_its_children_with_it(tmp_path):
    log = tmp_path / "family.log"
    stand_in = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, FAMILY, str(log)],
        stdout=subprocess.PIPE,
        env=procs.python_env(),
        text=True,
    )
    try:
        leader = int(stand_in.stdout.readline())
        worker = worker_of(log)
        assert set(procs.group_members(leader)) == {leader, worker}
        stand_in.kill()  # no finally, no atexit: only the watchdog can act
        stand_in.wait()
        # SIGTERM, the watchdog's 5 s grace (the worker ignores SIGTERM), then SIGKILL.
        took = wait_gone([leader, worker], timeout_s=15)
        assert took < 8
        assert procs.group_members(leader) == []
    finally:
        if stand_in.poll() is None:
            stand_in.kill()


def test_a_dead_leader_takes_the_rest_of_its_group_at_once(tmp_path):
    log = tmp_path / "family.log"
    proc = procs.spawn([sys.executable, "-c", FAMILY], log, procs.python_env())
    try:
        worker = worker_of(log)
        proc.send_signal(signal.SIGKILL)  # the API server dies; its engine must not linger
        proc.wait()
        took = wait_gone([worker], timeout_s=15)
        assert took < 8  # the watchdog's poll (0.2 s) and grace, not the runner's next look
        assert procs.exit_text(proc.returncode) == "was killed by signal SIGKILL (9)"
    finally:
        procs.stop(proc, grace_s=2)
    assert procs._WATCHDOGS == {}


def test_a_stopped_child_leaves_no_watchdog_behind(tmp_path):
    log = tmp_path / "family.log"
    proc = procs.spawn([sys.executable, "-c", FAMILY], log, procs.python_env())
    worker = worker_of(log)
    watchdog = procs._WATCHDOGS[proc.pid][0]
    assert watchdog.poll() is None
    assert procs.stop(proc, grace_s=1) == -signal.SIGTERM
    assert watchdog.poll() == 0  # disarmed and reaped
    wait_gone([worker, watchdog.pid], timeout_s=1)
    assert procs.run([sys.executable, "-c", "pass"], tmp_path / "run.log") == 0
    assert procs._WATCHDOGS == {}


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (0, "exited with code 0"),
        (1, "exited with code 1"),
        (-9, "was killed by signal SIGKILL (9)"),
        (-15, "was killed by signal SIGTERM (15)"),
        (None, "is still running"),
    ],
)
def test_exit_text_names_the_code_or_the_signal(code, text):
    assert procs.exit_text(code) == text


def ignore_sigint() -> None:
    """What a shell's background job or some CI harnesses leave a child: SIGINT ignored.
    SIGHUP as a terminal leaves it, whatever this test session was started under (under
    ``nohup`` it is ignored, on purpose, and the runner then rightly keeps ignoring it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def running(pid: int, needle: str) -> bool:
    """Whether a live descendant of ``pid`` has ``needle`` in its command line."""
    for kid in psutil.Process(pid).children(recursive=True):
        try:
            if needle in " ".join(kid.cmdline()):
                return True
        except psutil.Error:
            continue
    return False


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGHUP, signal.SIGKILL], ids=["sigint", "sighup", "sigkill"]
)
def test_the_runner_stops_on_a_signal_its_parent_left_ignored(tiny_model, tmp_path, sig):
    spec = parse_spec(
        {
            "model": {"id": str(tiny_model), "max_model_len": 512},
            "workload": {"input_len": 32, "output_len": 32, "num_prompts": 5000},
            "backends": [{"kind": "hf-sequential", "num_prompts": 1000}],
        }
    )
    (tmp_path / "spec.json").write_text(spec.model_dump_json())
    argv = [sys.executable, "-m", "runners", "run", str(tmp_path / "spec.json")]
    argv += ["--out", str(tmp_path / "result.json"), "--workdir", str(tmp_path / "work")]
    with open(tmp_path / "stderr.txt", "w") as stderr:
        runner = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=stderr, preexec_fn=ignore_sigint
        )
    try:
        deadline = time.monotonic() + 120
        while not running(runner.pid, "-m runners hf "):
            assert time.monotonic() < deadline, "the HF baseline did not start"
            assert runner.poll() is None, (tmp_path / "stderr.txt").read_text()
            time.sleep(0.2)
        time.sleep(1)
        children = [c.pid for c in psutil.Process(runner.pid).children(recursive=True)]
        started = time.monotonic()
        runner.send_signal(sig)
        code = runner.wait(timeout=30)
        took = time.monotonic() - started
    finally:
        if runner.poll() is None:
            runner.kill()
    wait_gone(children, timeout_s=15)
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        return
    assert code == ExitCode.INTERRUPTED and took < 15, (tmp_path / "stderr.txt").read_text()
    document = json.loads((tmp_path / "result.json").read_text())
    what = "SIGINT (Ctrl-C)" if sig == signal.SIGINT else "SIGHUP"
    assert document["errors"][-1]["message"].startswith(f"interrupted by {what}")
