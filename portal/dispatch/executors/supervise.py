"""Run a command, wait for it, and record its exit status in a file.

    python supervise.py EXIT_FILE -- COMMAND [ARG...]

The local executor starts the runner through this script (as a file, so it needs no
package on the path) in a new session: the runner's exit code then survives even though
no portal process is its parent. SIGTERM/SIGINT reach the whole process group; this
script outlives them to record what the runner did, and a SIGKILL to the group ends it
too (the run is then reported as lost, which only happens on cancel or deadline).
Exit status: the command's (128 + N when killed by signal N), 127 if it could not start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def _write(path: str, code: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(f"{code}\n")
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: supervise.py EXIT_FILE -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    exit_file, command = argv[0], argv[2:]

    def _note(signum: int, _frame: object) -> None:
        # The group got the signal too; keep waiting so the runner's code is recorded.
        print(f"[servebench] supervisor: got signal {signum}, waiting for the runner", flush=True)

    # A Python handler (not SIG_IGN) so the child does not inherit "ignore" across exec.
    signal.signal(signal.SIGTERM, _note)
    signal.signal(signal.SIGINT, _note)
    print(f"[servebench] starting: {' '.join(command)}", flush=True)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"[servebench] could not start the runner: {exc}", flush=True)
        _write(exit_file, 127)
        return 127
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us
            continue
    status = 128 - code if code < 0 else code
    print(f"[servebench] runner exited with code {status}", flush=True)
    _write(exit_file, status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
