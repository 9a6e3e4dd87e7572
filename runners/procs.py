"""Child processes that are always cleaned up: own process group, logged, killed as a group.

The runner starts three kinds of children: the vLLM server (which forks engine workers),
vLLM's bench client and the HF baseline. Each gets a session of its own
(``start_new_session``), so

- a Ctrl-C on the terminal reaches only the runner, which then stops them in order;
- stopping kills the whole group, engine workers included, not just the leader;
- nothing is left holding a GPU after the runner exits, whatever the exit path.

Output goes to a log file, never a pipe (a full pipe would block a chatty server).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def spawn(
    argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start ``argv`` (no shell) in a new session, stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def python_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment, with this ``runners`` package importable by a child Python.

    ``python -m runners.x`` in a child must find the same package as the parent even
    when the runner was started from another directory.
    """
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, **(extra or {})}
    path = env.get("PYTHONPATH", "")
    if root not in path.split(os.pathsep):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, path) if p)
    return env


def proc_stats(proc: Path = Path("/proc")) -> Iterator[tuple[int, str, list[str]]]:
    """``(pid, comm, fields after comm)`` of every process in ``/proc/<pid>/stat``.

    ``comm`` may hold spaces and parentheses (and a kernel worker's changes as it works),
    so it is cut at the first "(" and the last ")"; fields[0] is the state, fields[1] the
    parent pid, fields[2] the process group, fields[11:15] utime, stime, cutime, cstime,
    fields[19] the start time (clock ticks after boot). A process that exits while it is
    read is skipped.
    """
    try:
        entries = list(proc.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        yield (
            int(entry.name),
            stat[stat.index("(") + 1 : stat.rindex(")")],
            stat[stat.rindex(")") + 2 :].split(),
        )


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group.

    Zombies hold no memory, GPU or port, only a process-table slot until their parent
    (init, or the runner when it is a container's PID 1) reaps them, so they count as
    gone. Reads /proc (Linux, where vLLM runs); elsewhere falls back to killpg(0).
    """
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        return [pgid]
    return [
        pid
        for pid, _comm, fields in proc_stats(proc)
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X")
    ]


def group_alive(pgid: int) -> bool:
    """Whether any live process of the group still exists."""
    return bool(group_members(pgid))


def _signal_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, sig)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM until the block ends, so cleanup itself is not interrupted.

    A signal that arrives meanwhile is delivered (and raises) right after the block.
    """
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    except (AttributeError, ValueError):  # not the main thread / no pthreads
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> int | None:
    """SIGTERM the process group, wait ``grace_s``, then SIGKILL whatever is left.

    Waits for the leader (so it is reaped) and for the rest of the group to vanish.
    Returns the leader's exit code.
    """
    pgid = proc.pid  # leader of its own session: pgid == pid
    with signals_deferred():
        if proc.poll() is None or group_alive(pgid):
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                proc.poll()
                if proc.returncode is not None and not group_alive(pgid):
                    break
                time.sleep(0.1)
            else:
                _signal_group(pgid, signal.SIGKILL)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            proc.wait()
        # Orphaned group members are reparented to init, which reaps them; wait briefly.
        deadline = time.monotonic() + grace_s
        while group_alive(pgid) and time.monotonic() < deadline:
            _signal_group(pgid, signal.SIGKILL)
            time.sleep(0.1)
    return proc.returncode


def run(
    argv: Sequence[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> int:
    """Run a child to completion; on any exception (Ctrl-C included) stop its group first."""
    proc = spawn(argv, log_path, env)
    try:
        return proc.wait(timeout=timeout_s)
    except BaseException:
        stop(proc, grace_s=5.0)
        raise
    finally:
        if group_alive(proc.pid):
            stop(proc, grace_s=5.0)


def tail(path: Path, lines: int = 30, max_chars: int = 6000) -> str:
    """The last ``lines`` lines of a log (bounded), for failure reasons people can act on."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"
    out = "\n".join(text.splitlines()[-lines:])
    return out[-max_chars:]


def log_section(path: Path | None, text: str) -> str:
    """The end of a failure message that quotes a log: "Last lines of its log (PATH):" and
    the lines, or that the log is empty (never a heading with nothing under it)."""
    if path is None:
        return "It left no log."
    if not text.strip() or text == "(no log)":
        return f"Its log ({path}) is empty: it failed before writing anything."
    return f"Last lines of its log ({path}):\n{text}"


# --------------------------------------------------------------------------- memory cgroup

CGROUP = Path("/sys/fs/cgroup")
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a page-rounded 2**63 - 1


def oom_kills(root: Path = CGROUP) -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory
    cgroup: ``oom_kill`` of ``memory.events`` (cgroup v2) or of ``memory/memory.oom_control``
    (v1, as a container sees its own). None where neither can be read."""
    for path in (root / "memory.events", root / "memory" / "memory.oom_control"):
        with suppress(OSError, ValueError):
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


def memory_limit(root: Path = CGROUP) -> int | None:
    """This process's memory cgroup limit in bytes (``memory.max`` or v1's
    ``memory.limit_in_bytes``); None when unlimited or unreadable."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        with suppress(OSError, ValueError):
            text = path.read_text().strip()
            if text == "max":
                return None
            value = int(text)
            return value if value < _UNLIMITED else None
    return None


def quantity(n: int) -> str:
    """Bytes as the Kubernetes quantity a spec's resources.memory is written in."""
    for unit, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def oom_cause(kills_before: int | None, root: Path = CGROUP) -> str | None:
    """The run's first line when the OOM killer killed processes of this runner since
    ``kills_before`` (``oom_kills()`` at its start); None otherwise. A child killed that
    way exits with -9, and only the cgroup's counter tells it from any other SIGKILL."""
    now = oom_kills(root)
    if kills_before is None or now is None or now <= kills_before:
        return None
    limit = memory_limit(root)
    within = f"its memory limit, {quantity(limit)}" if limit else "the machine's memory"
    return (
        f"out of memory: the kernel's OOM killer killed {now - kills_before} process(es) of "
        f"this runner ({within}). Next: raise resources.memory, or ask for less "
        "(a smaller max_model_len, fewer prompts in flight)"
    )
