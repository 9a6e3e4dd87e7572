"""The local executor: the runner as a subprocess on the worker's machine.

Each run gets a work dir ``$SERVEBENCH_DATA_DIR/runs/<public_id>/`` holding ``spec.json``,
``runner.log`` (stdout and stderr), ``result.json`` (the runner's ``--out``), ``work/``
(the runner's ``--workdir``: server logs, raw client output) and the supervisor's files
(``supervise.py``: ``supervisor.lock``, ``supervisor.json``, ``exit_code``). The command is
an argv list, never a shell string:

    [unshare --pid --fork --mount --kill-child [--user --map-root-user]]
    python supervise.py --workdir DIR [--isolated --mask ... --keep DIR] --
        SERVEBENCH_RUNNER_PYTHON -m runners run spec.json --report URL --out result.json \
            --workdir work

with ``SERVEBENCH_RUN_TOKEN`` in its environment (not on the command line, where ``ps``
shows it) and without the portal's own secrets. It runs in a new session, so it outlives
the Celery task (and the worker) that started it.

**Handle.** ``handle_for(run)`` is ``{"workdir": ...}``, derived from the run id alone, so
dispatch stores it in the same update that claims the run: whatever dies when, reconcile
and cancel can always find the runner. ``submit`` adds ``pid`` / ``start_time`` of the
process it started (a hint for cancel; liveness never depends on them).

**Status** comes from the supervisor's files, not from pids: its lock held and
``supervisor.json`` written = running (the lock alone: still starting); an
``exit_code`` = ended with that code; ``supervisor.json`` without an exit code = the
supervisor was killed; none of them = nothing was started (``not-started``: the worker
died between the claim and the start, and dispatch may safely start it now). ``submit``
is idempotent: it starts nothing when the run was already started.

**Isolation** (``SERVEBENCH_LOCAL_ISOLATION``): ``auto`` (default) runs the supervisor as
PID 1 of PID and mount namespaces of its own when ``unshare`` works here (root, or
unprivileged user namespaces): the runner sees only its own processes in ``/proc`` (not the
portal's environment), the portal's secret files, the dev services' directory and other
runs' work dirs are hidden from it, and when the supervisor exits the kernel kills
everything left in the namespace. Without namespaces the supervisor is a child subreaper
and sweeps the runner's orphans itself. ``namespaces`` requires them (the run fails with
the reason otherwise); ``none`` never uses them.

**Slots** (``SERVEBENCH_LOCAL_SLOTS``, default 1): a benchmark owns the machine, so
dispatch starts at most that many runners at once (``portal.dispatch.dispatcher``), and
gives each claimed run a slot index (in its handle). Each slot owns disjoint GPUs and the
cores nearest them (``runners.placement``, from this host's GPUs and topology as NVML
says, or the ``host`` given): the runner gets them as ``CUDA_VISIBLE_DEVICES`` and
``SERVEBENCH_CPUS`` (it pins itself and its children to those cores), and the first
line of its log says which. With one slot nothing is set: the run owns the machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
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

from portal.dispatch.executors import supervise
from portal.dispatch.executors.base import (
    Executor,
    ExecutorError,
    ExecutorState,
    ExecutorStatus,
    Handle,
    report_url,
)
from runners import placement

if TYPE_CHECKING:
    from portal.benchmarks.models import Run

log = logging.getLogger(__name__)

SUPERVISOR = Path(supervise.__file__)
LOG_NAME = "runner.log"
EXIT_NAME = supervise.EXIT_NAME
LOCK_NAME = supervise.LOCK_NAME
STARTED_NAME = supervise.STARTED_NAME

# Never handed to the runner: it talks to the portal over HTTP with its run token only.
_SECRET_VARS = {
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "SERVEBENCH_TOKEN_KEY",
    "DJANGO_SETTINGS_MODULE",
    "CELERY_BROKER_URL",
}
_SECRET_WORDS = ("SECRET", "PASSWORD", "PASSWD", "_TOKEN", "CREDENTIAL", "_KEY")
# ...except what the runner itself needs (a hub token for gated models).
_RUNNER_PREFIXES = ("HF_", "HUGGING_FACE_", "VLLM_", "CUDA_", "NVIDIA_")


def _is_secret(key: str) -> bool:
    """A portal secret, given directly or as ``NAME_FILE`` (portal.lib.env reads both);
    not ``SSL_CERT_FILE`` and the like, which the runner needs."""
    name = key.removesuffix("_FILE")
    return name in _SECRET_VARS or any(word in name for word in _SECRET_WORDS)


def runner_environment(token: str) -> dict[str, str]:
    """The runner's environment: ours minus secrets, plus its run token."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key.startswith(_RUNNER_PREFIXES) or not _is_secret(key)
    }
    # The repo root first, so `-m runners` works from a checkout without an install.
    base = str(settings.BASE_DIR)
    env["PYTHONPATH"] = os.pathsep.join([base, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    env["SERVEBENCH_RUN_TOKEN"] = token
    return env


def secret_paths() -> list[Path]:
    """Files and directories of the portal a runner must not read: every ``*_FILE``
    secret named in our environment and the dev services' directory (the quickstart's
    secret key, the embedded PostgreSQL's data and socket)."""
    paths = [Path(settings.SERVEBENCH_HOME) / "dev"]
    for key, value in os.environ.items():
        if key.endswith("_FILE") and _is_secret(key) and value.startswith("/"):
            paths.append(Path(value))
    return [p for p in dict.fromkeys(paths) if p.exists()]


@functools.cache
def _unshare_prefix() -> tuple[list[str] | None, str]:
    """The ``unshare`` argv that gives the supervisor PID and mount namespaces of its own,
    or None with the reason it does not work on this machine. Probed once per process."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None, "the unshare command (util-linux) is not installed"
    prefix = [unshare]
    if os.geteuid() != 0:
        prefix += ["--user", "--map-root-user"]
    prefix += ["--pid", "--fork", "--mount", "--kill-child"]
    probe = "import os, sys; sys.exit(0 if os.getpid() == 1 else 3)"
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-c", probe],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"unshare failed: {exc}"
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        return None, f"unshare failed: {err[-1] if err else f'exit code {done.returncode}'}"
    return prefix, ""


def isolation_prefix(mode: str) -> list[str] | None:
    """The namespace prefix for ``mode`` (auto | namespaces | none); ExecutorError when
    ``namespaces`` is required but unavailable."""
    if mode == "none":
        return None
    prefix, why = _unshare_prefix()
    if prefix is None:
        if mode == "namespaces":
            raise ExecutorError(
                "SERVEBENCH_LOCAL_ISOLATION=namespaces, but this machine cannot give the "
                f"runner namespaces of its own ({why}); run the worker as root, allow "
                "unprivileged user namespaces, or set SERVEBENCH_LOCAL_ISOLATION=auto"
            )
        log.warning(
            "local executor: runners are not isolated in namespaces (%s): they can read "
            "the /proc of other processes of this user",
            why,
        )
    return prefix


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


def _start_time(pid: int) -> int | None:
    try:
        return supervise._start_time(str(pid))
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int | None, start_time: int | None) -> bool:
    """Is ``pid`` still the process we started (not a recycled pid, not a zombie)?"""
    if not pid or start_time is None or _start_time(pid) != start_time:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def lock_held(workdir: Path) -> bool:
    """Whether a supervisor holds this run's lock (it does for as long as it lives)."""
    try:
        fh = (workdir / LOCK_NAME).open("rb")
    except FileNotFoundError:
        return False
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


class LocalExecutor(Executor):
    name = "local"

    def __init__(
        self,
        python: str | None = None,
        data_dir: Path | None = None,
        stop_grace_seconds: float | None = None,
        isolation: str | None = None,
        slots: int | None = None,
        host: placement.Host | None = None,
    ):
        self.python = python or settings.SERVEBENCH_RUNNER_PYTHON
        self.data_dir = Path(data_dir or settings.SERVEBENCH_DATA_DIR)
        self.stop_grace = (
            settings.SERVEBENCH_STOP_GRACE_SECONDS
            if stop_grace_seconds is None
            else stop_grace_seconds
        )
        self.isolation = isolation or settings.SERVEBENCH_LOCAL_ISOLATION
        self.slots = slots if slots is not None else settings.SERVEBENCH_LOCAL_SLOTS
        self._host = host
        self._plan: placement.Plan | None = None

    def placement(self) -> placement.Plan:
        """Each slot's GPUs and cores on this host (read once); ExecutorError when the
        slots cannot be given disjoint GPUs (the message says what to change)."""
        if self._plan is None:
            host = self._host if self._host is not None else placement.this_host()
            try:
                self._plan = placement.plan(
                    host, self.slots or 1, os.environ.get("CUDA_VISIBLE_DEVICES")
                )
            except placement.PlacementError as exc:
                raise ExecutorError(str(exc)) from None
        return self._plan

    def slot_of(self, run: Run) -> placement.Slot | None:
        """The slot a claimed run owns (its handle's index); None without slots."""
        index = (run.executor_handle or {}).get("slot")
        if not isinstance(index, int) or not self.slots or self.slots < 2:
            return None
        slots = self.placement().slots
        return slots[index] if 0 <= index < len(slots) else None

    def workdir(self, run: Run) -> Path:
        return self.data_dir / "runs" / run.public_id

    def handle_for(self, run: Run) -> Handle:
        return {"workdir": str(self.workdir(run))}

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

    def supervisor_argv(self, run: Run, workdir: Path, lock_fd: int | None = None) -> list[str]:
        """The whole argv: namespaces (when available), the supervisor, the runner."""
        prefix = isolation_prefix(self.isolation)
        argv = [sys.executable, str(SUPERVISOR), "--workdir", str(workdir)]
        if lock_fd is not None:
            argv += ["--lock-fd", str(lock_fd)]
        if prefix is not None:
            argv = [*prefix, *argv, "--isolated", "--mask", str(self.data_dir / "runs")]
            for path in secret_paths():
                argv += ["--mask", str(path)]
            argv += ["--keep", str(workdir)]
        return [*argv, "--", *self.command(run, workdir)]

    def submit(self, run: Run, token: str) -> Handle:
        handle = self.handle_for(run)
        slot = self.slot_of(run)
        if slot is not None:
            handle = {**handle, "slot": slot.index}
        current = self.status(handle)
        if current.state != ExecutorState.NOT_STARTED:
            log.info("local executor: the runner was already started (%s)", current.state)
            return handle  # idempotent: a repeated submit starts nothing
        if shutil.which(self.python) is None:
            raise ExecutorError(
                f"the runner interpreter {self.python!r} does not exist or is not executable; "
                "set SERVEBENCH_RUNNER_PYTHON to a Python with the runners' dependencies"
            )
        workdir = Path(handle["workdir"])
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "spec.json").write_text(json.dumps(run.spec, indent=2), encoding="utf-8")
            log_file = (workdir / LOG_NAME).open("ab")
            if slot is not None:
                notes = "".join(f"; {n}" for n in self.placement().notes)
                log_file.write(f"[servebench] {slot.describe()}{notes}\n".encode())
                log_file.flush()
        except OSError as exc:
            raise ExecutorError(
                f"cannot prepare the run's work dir {workdir} ({exc.strerror}); "
                "check SERVEBENCH_DATA_DIR is writable"
            ) from None
        # The supervisor's lock, opened here and inherited by `unshare` as well as by the
        # supervisor: it stays held until the last process of the run is gone.
        lock_fd = os.open(workdir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        argv = self.supervisor_argv(run, workdir, lock_fd)
        try:
            with log_file:
                proc = subprocess.Popen(
                    argv,
                    cwd=workdir,
                    env={**runner_environment(token), **(slot.env if slot else {})},
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(lock_fd,),
                )
        except OSError as exc:
            raise ExecutorError(f"cannot start the runner: {exc}") from None
        finally:
            os.close(lock_fd)
        return {**handle, "pid": proc.pid, "start_time": _start_time(proc.pid)}

    # ----------------------------------------------------------------- inspection

    def _started(self, workdir: Path) -> dict | None:
        try:
            return json.loads((workdir / STARTED_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _exit_code(self, workdir: Path) -> int | None:
        try:
            return int((workdir / EXIT_NAME).read_text().strip())
        except (OSError, ValueError):
            return None

    def status(self, handle: Handle) -> ExecutorStatus:
        try:
            workdir = Path(handle["workdir"])
        except (KeyError, TypeError):
            return ExecutorStatus(ExecutorState.GONE, reason="the run's handle has no work dir")
        if lock_held(workdir):
            # The supervisor takes the lock, then records its start: between the two it
            # is still starting, and if it is killed there the runner never ran (the run
            # is dispatched again), so that moment is not yet "running".
            if self._started(workdir) is None:
                return ExecutorStatus(ExecutorState.PENDING, reason="the runner is starting")
            return ExecutorStatus(ExecutorState.RUNNING)
        code = self._exit_code(workdir)
        if code is not None:
            if code == 0:
                return ExecutorStatus(ExecutorState.SUCCEEDED, exit_code=0)
            reason = f"runner exited with code {code}"
            if code > 128:
                with contextlib.suppress(ValueError):
                    reason += f" ({signal.Signals(code - 128).name})"
            return ExecutorStatus(ExecutorState.FAILED, reason=reason, exit_code=code)
        if self._started(workdir) is not None:
            return ExecutorStatus(
                ExecutorState.GONE,
                reason=(
                    "the runner's supervisor was killed before it could record how the "
                    "runner ended (cancelled, killed with its process group, or the machine "
                    "restarted)"
                ),
            )
        if _alive(handle.get("pid"), handle.get("start_time")):
            return ExecutorStatus(ExecutorState.PENDING, reason="the runner is starting")
        return ExecutorStatus(
            ExecutorState.NOT_STARTED, reason="no runner was started for this run yet"
        )

    def logs(self, handle: Handle, tail: int = 50) -> str:
        try:
            return _tail(Path(handle["workdir"]) / LOG_NAME, tail)
        except (KeyError, TypeError):
            return ""

    # ----------------------------------------------------------------- control

    def _supervisor_pid(self, handle: Handle) -> int | None:
        """The pid of the process we started, if it is still that process."""
        started = self._started(Path(handle["workdir"])) or {}
        for pid, start_time in (
            (started.get("pid"), started.get("start_time")),
            (handle.get("pid"), handle.get("start_time")),
        ):
            if _alive(pid, start_time):
                return int(pid)
        return None

    def cancel(self, handle: Handle) -> None:
        """SIGTERM the runner (through its supervisor), SIGKILL after the grace period.

        With namespaces, killing the supervisor kills everything in them. Without, the
        runner's vLLM server and bench client run in sessions of their own: note them
        first, so that if the runner dies before its own cleanup they go too.
        """
        workdir = Path(handle["workdir"])
        pid = self._supervisor_pid(handle)
        if pid is None:
            return
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            return
        descendants = _descendants(pid)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_grace
        while time.monotonic() < deadline and (lock_held(workdir) or _group_alive(pgid)):
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        for proc in descendants:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if proc.is_running():
                    os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and lock_held(workdir):
            time.sleep(0.1)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
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
