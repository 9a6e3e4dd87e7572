"""Child process groups are always cleaned up, whatever they do with signals."""

from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from runners import procs


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _descendants(proc: subprocess.Popen, n: int) -> list[int]:
    deadline = time.monotonic() + 10
    while len(kids := psutil.Process(proc.pid).children(recursive=True)) < n:
        assert time.monotonic() < deadline, "the child never forked"
        time.sleep(0.05)
    return [k.pid for k in kids]


def test_stop_kills_the_whole_group_not_just_the_leader(tmp_path):
    proc = procs.spawn(["sh", "-c", "sleep 300 & sleep 300 & wait"], tmp_path / "log")
    kids = _descendants(proc, 2)
    assert procs.stop(proc, grace_s=5) is not None
    assert not procs.group_alive(proc.pid)
    assert all(_gone(pid) for pid in [proc.pid, *kids])


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    proc = procs.spawn(["sh", "-c", "trap '' TERM; sleep 300 & wait"], tmp_path / "log")
    kids = _descendants(proc, 1)
    assert procs.stop(proc, grace_s=0.5) == -9  # it took SIGKILL
    assert not procs.group_alive(proc.pid)
    assert all(_gone(pid) for pid in kids)


def test_run_stops_the_child_when_the_caller_gives_up(tmp_path):
    log = tmp_path / "log"
    with pytest.raises(subprocess.TimeoutExpired):
        procs.run(["sh", "-c", "echo $$; sleep 300 & echo $!; wait"], log, timeout_s=5)
    pids = [int(line) for line in log.read_text().split()]
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


def test_children_get_a_session_of_their_own(tmp_path):
    """A Ctrl-C on the terminal reaches the runner only; the runner stops the children."""
    proc = procs.spawn(["sleep", "300"], tmp_path / "log")
    try:
        assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    finally:
        procs.stop(proc)


def test_output_goes_to_the_log_and_tail_quotes_its_end(tmp_path):
    log = tmp_path / "child.log"
    code = procs.run(["sh", "-c", "for i in $(seq 1 100); do echo line $i; done; exit 3"], log)
    assert code == 3
    assert procs.tail(log, lines=2) == "line 99\nline 100"
    assert procs.tail(tmp_path / "missing.log") == "(no log)"


def test_children_can_import_this_package_from_anywhere(tmp_path):
    out = subprocess.run(
        ["python3", "-c", "import runners; print(runners.__file__)"],
        env=procs.python_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip().endswith("runners/__init__.py")
