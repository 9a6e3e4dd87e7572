"""The local executor: the runner as a subprocess on the worker's machine.

Each run gets a work dir ``$SERVEBENCH_DATA_DIR/runs/<public_id>/`` holding ``spec.json``,
``runner.log`` (stdout and stderr), ``result.json`` (the runner's ``--out``), ``work/``
(the runner's ``--workdir``: server logs, raw client output) and ``exit_code`` (written by
``supervise.py``). The command is an argv list, never a shell
string:

    SERVEBENCH_RUNNER_PYTHON -m runners run spec.json --report URL --out result.json \
        --workdir work

with ``SERVEBENCH_RUN_TOKEN`` in its environment (not on the command line, where ``ps``
shows it) and without the portal's own secrets. It runs in a new session (its own process
group), so it outlives the Celery task that started it, and cancel stops the whole group.

Handle: ``{"pid", "pgid", "workdir", "started"}``; ``started`` is the process's create
time, which guards against a recycled pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
from django.conf import settings

from portal.dispatch.executors.base import (
    Executor,
    ExecutorError,
    ExecutorState,
    ExecutorStatus,
    Handle,
    report_url,
)

if TYPE_CHECKING:
    from portal.benchmarks.models import Run

SUPERVISOR = Path(__file__).with_name("supervise.py")
LOG_NAME = "runner.log"
EXIT_NAME = "exit_code"

# Never handed to the runner: it talks to the portal over HTTP with its run token only.
_SECRET_VARS = {
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "SERVEBENCH_TOKEN_KEY",
    "DJANGO_SETTINGS_MODULE",
    "CELERY_BROKER_URL",
}
_SECRET_WORDS = ("SECRET", "PASSWORD", "PASSWD", "_TOKEN", "CREDENTIAL")
# ...except what the runner itself needs (a hub token for gated models).
_RUNNER_PREFIXES = ("HF_", "HUGGING_FACE_", "VLLM_", "CUDA_", "NVIDIA_")


def runner_environment(token: str) -> dict[str, str]:
    """The runner's environment: ours minus secrets, plus its run token."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key.startswith(_RUNNER_PREFIXES)
        or (
            key not in _SECRET_VARS
            and not key.endswith("_FILE")
            and not any(word in key for word in _SECRET_WORDS)
        )
    }
    # The repo root first, so `-m runners` works from a checkout without an install.
    base = str(settings.BASE_DIR)
    env["PYTHONPATH"] = os.pathsep.join([base, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env["SERVEBENCH_RUN_TOKEN"] = token
    return env


def _tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:]) if lines > 0 else ""


class LocalExecutor(Executor):
    name = "local"

    def __init__(
        self,
        python: str | None = None,
        data_dir: Path | None = None,
        stop_grace_seconds: float | None = None,
    ):
        self.python = python or settings.SERVEBENCH_RUNNER_PYTHON
        self.data_dir = Path(data_dir or settings.SERVEBENCH_DATA_DIR)
        self.stop_grace = (
            settings.SERVEBENCH_STOP_GRACE_SECONDS
            if stop_grace_seconds is None
            else stop_grace_seconds
        )

    def workdir(self, run: Run) -> Path:
        return self.data_dir / "runs" / run.public_id

    def command(self, run: Run, workdir: Path) -> list[str]:
        return [
            self.python,
            "-m",
            "runners",
            "run",
            str(workdir / "spec.json"),
            "--report",
            report_url(run),
            "--out",
            str(workdir / "result.json"),
            "--workdir",
            str(workdir / "work"),
        ]

    def submit(self, run: Run, token: str) -> Handle:
        if shutil.which(self.python) is None:
            raise ExecutorError(
                f"the runner interpreter {self.python!r} does not exist or is not executable; "
                "set SERVEBENCH_RUNNER_PYTHON to a Python with the runners' dependencies"
            )
        workdir = self.workdir(run)
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / EXIT_NAME).unlink(missing_ok=True)
            (workdir / "spec.json").write_text(json.dumps(run.spec, indent=2), encoding="utf-8")
            log = (workdir / LOG_NAME).open("ab")
        except OSError as exc:
            raise ExecutorError(
                f"cannot prepare the run's work dir {workdir} ({exc.strerror}); "
                "check SERVEBENCH_DATA_DIR is writable"
            ) from None
        argv = [
            sys.executable,
            str(SUPERVISOR),
            str(workdir / EXIT_NAME),
            "--",
            *self.command(run, workdir),
        ]
        try:
            with log:
                proc = subprocess.Popen(
                    argv,
                    cwd=workdir,
                    env=runner_environment(token),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
        except OSError as exc:
            raise ExecutorError(f"cannot start the runner: {exc}") from None
        try:
            started = psutil.Process(proc.pid).create_time()
        except psutil.NoSuchProcess:  # already gone; status() will read its exit code
            started = time.time()
        return {"pid": proc.pid, "pgid": proc.pid, "workdir": str(workdir), "started": started}

    # ----------------------------------------------------------------- inspection

    def _process(self, handle: Handle) -> psutil.Process | None:
        """Our supervisor process if it is still alive (not a zombie, not a reused pid)."""
        try:
            proc = psutil.Process(int(handle["pid"]))
            if abs(proc.create_time() - float(handle["started"])) > 1.0:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
            return None

    def _exit_code(self, handle: Handle) -> int | None:
        try:
            return int((Path(handle["workdir"]) / EXIT_NAME).read_text().strip())
        except (OSError, ValueError, KeyError):
            return None

    def status(self, handle: Handle) -> ExecutorStatus:
        if self._process(handle) is not None:
            return ExecutorStatus(ExecutorState.RUNNING)
        code = self._exit_code(handle)
        if code is None:
            return ExecutorStatus(
                ExecutorState.GONE,
                reason=(
                    "the runner process is gone and left no exit code (killed together with "
                    "its supervisor, or the machine restarted)"
                ),
            )
        if code == 0:
            return ExecutorStatus(ExecutorState.SUCCEEDED, exit_code=0)
        reason = f"runner exited with code {code}"
        if code > 128:
            with contextlib.suppress(ValueError):
                reason += f" ({signal.Signals(code - 128).name})"
        return ExecutorStatus(ExecutorState.FAILED, reason=reason, exit_code=code)

    def logs(self, handle: Handle, tail: int = 50) -> str:
        try:
            return _tail(Path(handle["workdir"]) / LOG_NAME, tail)
        except KeyError:
            return ""

    # ----------------------------------------------------------------- control

    def cancel(self, handle: Handle) -> None:
        """SIGTERM the runner's process group, then SIGKILL whatever is left after the grace."""
        supervisor = self._process(handle)
        if supervisor is None:
            return
        pgid = int(handle["pgid"])
        # The runner starts the vLLM server and bench client in sessions of their own (so
        # it can stop each as a group); note them now, so that if the runner is killed
        # before its own cleanup, they do not outlive it holding the GPU.
        descendants = _descendants(supervisor)
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + self.stop_grace
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        for proc in descendants:
            with contextlib.suppress(psutil.Error):
                if proc.is_running():
                    os.killpg(os.getpgid(proc.pid), signal.SIGKILL)


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return False
