"""A watchdog for one child's process group: it ends the group when the runner dies, or
when the group's leader dies, however either dies.

``runners.procs.spawn`` starts one beside every child (``python -m runners.groupwatch PGID
GRACE_S``), in a session of its own, with the read end of a pipe as its stdin; only the
runner holds the write end. Then:

- the runner dies (SIGKILL, OOM, a crash, a closed terminal: any way at all): the kernel
  closes the write end, the watchdog reads end-of-file and stops the whole group, so no
  vLLM server, engine process or bench client outlives a runner started on its own (no
  portal, no supervisor, no container to take them down);
- the group's leader exits (the vLLM API server dies) while others of its group live on
  (its engine processes, holding memory): the watchdog stops them within a fraction of a
  second instead of leaving them until the runner notices;
- the runner stops the child itself: it writes one byte first (``disarm``), and the
  watchdog exits without touching anything.

Stopping is SIGTERM to the group, ``GRACE_S`` seconds, then SIGKILL. Polled every 0.2 s;
reads ``/proc`` (Linux, where vLLM runs).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from contextlib import suppress
from pathlib import Path

from runners.procs import group_members

POLL_S = 0.2


def leader_dead(pid: int, pgid: int) -> bool:
    """The leader exited: gone, a zombie, or its pid reused outside the group."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0] in ("Z", "X") or int(fields[2]) != pgid


def end_group(pgid: int, grace_s: float) -> None:
    """SIGTERM the group, wait up to ``grace_s`` for it to empty, then SIGKILL the rest."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    while group_members(pgid):
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        time.sleep(0.1)


def watch(pgid: int, grace_s: float, fd: int = 0) -> str:
    """Wait for the runner (``fd`` end-of-file) or the leader (``pgid``) to die, or a
    disarm byte; return what happened ("disarmed", "runner died", "leader died")."""
    while True:
        ready, _, _ = select.select([fd], [], [], POLL_S)
        if ready:
            if os.read(fd, 1):
                return "disarmed"
            end_group(pgid, grace_s)
            return "runner died"
        if leader_dead(pgid, pgid):
            if group_members(pgid):
                end_group(pgid, grace_s)
            return "leader died"


def main(argv: list[str]) -> int:
    # Terminal signals are for the runner; this process must outlive it to do its job.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    pgid, grace_s = int(argv[0]), float(argv[1])
    watch(pgid, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
