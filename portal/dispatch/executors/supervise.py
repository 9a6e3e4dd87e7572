"""The local executor's supervisor: run the runner, record how it ended, leave nothing behind.

    python supervise.py --workdir DIR [--lock-fd N] [--isolated] [--mask PATH]...
        [--keep PATH] -- CMD...

The local executor starts the runner through this script (a file, so it needs no package
on the path), in a session of its own, so the runner outlives the Celery task that
started it. The script:

- holds an exclusive ``flock`` on ``DIR/supervisor.lock`` for as long as it lives. Any
  process can tell whether the run is alive by trying that lock, across PID namespaces
  and without trusting a pid. The executor opens the lock file and passes it down
  (``--lock-fd``) through ``unshare``: a flock belongs to the open file, so it is
  released only when ``unshare`` exits too, which is after the kernel has reaped every
  process of the namespace (PID 1's own exit releases its files before that). A second
  supervisor for the same run (while the first runs, or after it ran:
  ``supervisor.json`` exists) exits at once (code 75) without touching anything, so a
  repeated submit can never start the runner twice;
- writes ``DIR/supervisor.json`` (its pid as the executor sees it, that pid's start time,
  the isolation in use) before it starts the runner: "started" is then a fact on disk;
- forwards SIGTERM/SIGINT to the runner, so a cancel lets it stop its vLLM server itself;
- when the runner exits, however it exits (SIGKILL by the OOM killer included), stops
  every process the runner left behind (its vLLM server, the server's engine processes,
  the HF child), SIGTERM first, SIGKILL after a grace, and only then
- writes the runner's exit status to ``DIR/exit_code`` (128 + N when killed by signal N,
  127 if it could not start) and exits, which releases the lock.

With ``--isolated`` it runs as PID 1 of a PID and mount namespace of its own (the
executor starts it under ``unshare --pid --fork --mount``; ``--user --map-root-user`` when
not root): it mounts a fresh ``/proc`` that shows only the run's processes (so the runner
cannot read the portal's ``/proc/<pid>/environ``), hides each ``--mask`` path (a tmpfs
over a directory, ``/dev/null`` over a file; ``--keep`` paths under a masked directory
are bound back, i.e. the run's own work dir), and, being PID 1, every orphan is its child:
when it exits, the kernel kills whatever is left in the namespace. Without
``--isolated`` it makes itself a child subreaper, so orphans are reparented to it and the
same sweep finds them.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

LOCK_NAME = "supervisor.lock"
STARTED_NAME = "supervisor.json"
EXIT_NAME = "exit_code"
ALREADY_RUNNING = 75  # EX_TEMPFAIL: another supervisor holds this run's lock

_PR_SET_CHILD_SUBREAPER = 36
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_SWEEP_GRACE_S = 10.0

_libc = ctypes.CDLL(None, use_errno=True)  # libc, already loaded (find_library forks)


def say(message: str) -> None:
    print(f"[servebench] supervisor: {message}", flush=True)


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    rc = _libc.mount(
        source.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _start_time(pid: str = "self") -> int:
    """Field 22 of /proc/PID/stat: start time in clock ticks since boot (pid-reuse guard)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        stat = fh.read()
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def isolate(masks: list[str], keeps: list[str]) -> None:
    """In a fresh mount namespace as its PID 1: hide ``masks``, give back ``keeps``, and
    mount a /proc of this PID namespace."""
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE, None)  # nothing leaks back out
    # Paths to bind back, opened before their parents disappear under a tmpfs.
    kept = {path: os.open(path, os.O_PATH) for path in keeps if os.path.isdir(path)}
    for path in masks:
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=0755")
        elif os.path.exists(path):
            _mount("/dev/null", path, None, _MS_BIND, None)
    for path, fd in kept.items():
        if not os.path.isdir(path):
            os.makedirs(path, exist_ok=True)  # inside the masking tmpfs
            _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC, None)
        os.close(fd)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)


def _children(me: int) -> list[int]:
    """Live children of this process (after the runner dies, its orphans are ours)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        if int(ppid) == me and state not in ("Z", "X"):
            out.append(int(entry))
    return out


def _reap() -> None:
    """Collect exited children (zombies) without waiting."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def sweep(grace_s: float = _SWEEP_GRACE_S) -> int:
    """Stop everything the runner left behind: SIGTERM (vLLM shuts its engine down), then
    SIGKILL after ``grace_s``; returns how many processes were left. Waits until none is."""
    me = os.getpid()
    left = _children(me)
    if not left:
        _reap()
        return 0
    say(f"stopping {len(left)} process(es) the runner left behind: {left}")
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30.0)):
        deadline = time.monotonic() + wait_s
        while True:
            current = _children(me)
            if not current:
                _reap()
                return len(left)
            for pid in current:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(pid), sig)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            _reap()
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    say(f"could not stop: {_children(me)}")
    return len(left)


def _take(lock: object, patience_s: float = 3.0) -> bool:
    """Take the run's lock. Someone probing it (``LOCK_SH``, a few microseconds) is waited
    out; a supervisor that holds it keeps it for the whole run."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="supervise.py")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--isolated", action="store_true")
    parser.add_argument("--lock-fd", type=int, default=None)
    parser.add_argument("--mask", action="append", default=[])
    parser.add_argument("--keep", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    workdir = args.workdir

    if args.lock_fd is not None:
        # Opened by the executor and inherited by `unshare` too, so the lock outlives this
        # process until `unshare` has seen the whole namespace gone (see the docstring).
        lock = os.fdopen(args.lock_fd, "a+")
    else:
        lock = open(os.path.join(workdir, LOCK_NAME), "a+")  # noqa: SIM115 - held until exit
    started_path = os.path.join(workdir, STARTED_NAME)
    # A run's runner starts once: not while another supervisor holds the lock, and not
    # after one has run it (two submits that raced, the second one late).
    if not _take(lock) or os.path.exists(started_path):
        say("another supervisor is already running this run; leaving it alone")
        return ALREADY_RUNNING

    # Our pid as the executor sees it: /proc is still the parent namespace's here.
    outer_pid = int(os.readlink("/proc/self"))
    started = {"pid": outer_pid, "start_time": _start_time(str(outer_pid)), "isolated": False}
    exit_path = os.path.join(workdir, EXIT_NAME)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(exit_path)
    _write(started_path, json.dumps(started) + "\n")
    if args.isolated:
        try:
            if os.getpid() != 1:
                raise OSError(errno.EINVAL, "needs a PID namespace of its own (unshare --pid)")
            isolate(args.mask, args.keep)
        except OSError as exc:
            say(f"could not isolate the runner: {exc}")
            _write(exit_path, "126\n")
            return 126
        started["isolated"] = True
        _write(started_path, json.dumps(started) + "\n")
        say(f"isolated: own PID and mount namespaces, fresh /proc; hidden: {args.mask}")
    else:
        with contextlib.suppress(AttributeError, OSError):
            _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: object) -> None:
        say(f"got signal {signum}; passing it to the runner")
        if child is not None and child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)

    # Handlers (not SIG_IGN): the runner must not inherit "ignore" across exec, and as
    # PID 1 of a namespace only handled signals reach us at all.
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    say(f"starting: {' '.join(command)}")
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        say(f"could not start the runner: {exc}")
        _write(exit_path, "127\n")
        return 127
    status = None
    while status is None:
        # Reap every child (as PID 1 or subreaper, orphans are ours) until the runner ends.
        try:
            pid, raw = os.waitpid(-1, 0)
        except ChildProcessError:
            status = child.poll() if child.poll() is not None else 1
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us
            continue
        if pid == child.pid:
            child.returncode = os.waitstatus_to_exitcode(raw)
            code = child.returncode
            status = 128 - code if code < 0 else code
    say(f"runner exited with code {status}")
    sweep()
    _write(exit_path, f"{status}\n")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
