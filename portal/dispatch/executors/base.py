"""The executor interface: what dispatch and reconcile need from "somewhere to run".

An executor starts one runner per run and can be asked about it later, from another
process, with nothing but the JSON ``handle`` (stored on the Run):

- ``handle_for(run) -> handle``: derived from the run id alone (a work dir, a Job name),
  so dispatch stores it in the same update that claims the run. Whatever process dies
  when, reconcile and cancel can find the runner.
- ``submit(run, token) -> handle``: start ``python -m runners run SPEC --report URL`` with
  the run-scoped token in the environment (``SERVEBENCH_RUN_TOKEN``, never argv). Must
  not wait for the benchmark, and must be idempotent: when the runner of this run was
  already started it starts nothing. Returns ``handle_for(run)`` plus what it learnt
  (a pid, a Job uid). Raises ``ExecutorUnavailable`` for a transient problem (dispatch
  retries) and ``ExecutorError`` for a permanent one (the run fails with it).
- ``status(handle) -> ExecutorStatus``: ``not-started`` (nothing was ever started for
  this handle: a worker died between the claim and the start), ``pending`` (accepted, not
  running yet: pulling an image, waiting for a GPU), ``running``, ``succeeded`` /
  ``failed`` (the runner process ended with that exit status), or ``gone`` (it was
  started, and nothing is left to ask). ``reason`` says why in words; ``exit_code`` when
  known; ``queued_in`` names the cluster queue a pending runner waits to be admitted to
  (Kueue), time that does not count against the run's deadline.
- ``cancel(handle)``: stop it and everything it started; idempotent.
- ``logs(handle, tail) -> str``: the last ``tail`` lines of the runner's output.
- ``slots``: how many runners may run at once (``None``: the executor's own scheduler
  decides, as Kubernetes does with GPU requests).

The portal's run status comes from the runner's own reports; the executor's state only
matters when the runner ended without reporting (reconcile fails the run with the
reason and the log tail), was never started (dispatch starts it), or the deadline passed
(reconcile cancels it).
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from django.conf import settings
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from portal.benchmarks.models import Run

Handle = dict[str, Any]

EXECUTORS = {
    "local": "portal.dispatch.executors.local.LocalExecutor",
    "kubernetes": "portal.dispatch.executors.kubernetes.KubernetesExecutor",
}


class ExecutorState(enum.StrEnum):
    NOT_STARTED = "not-started"
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    GONE = "gone"


@dataclass(frozen=True)
class ExecutorStatus:
    state: ExecutorState
    reason: str = ""
    exit_code: int | None = None
    queued_in: str = ""

    @property
    def ended(self) -> bool:
        return self.state in (ExecutorState.SUCCEEDED, ExecutorState.FAILED, ExecutorState.GONE)


class ExecutorError(Exception):
    """The run cannot be started; the message is the run's failure reason."""


class ExecutorUnavailable(ExecutorError):
    """A transient problem (API server down, throttled): try again later."""


class Executor(abc.ABC):
    name: ClassVar[str]
    slots: int | None = None

    @abc.abstractmethod
    def handle_for(self, run: Run) -> Handle: ...

    @abc.abstractmethod
    def submit(self, run: Run, token: str) -> Handle: ...

    @abc.abstractmethod
    def status(self, handle: Handle) -> ExecutorStatus: ...

    @abc.abstractmethod
    def cancel(self, handle: Handle) -> None: ...

    @abc.abstractmethod
    def logs(self, handle: Handle, tail: int = 50) -> str: ...

    def observe(self, handle: Handle) -> ExecutorStatus:
        """``status`` without side effects, for readers (a GET must never change a Job):
        the same answer, but nothing is stopped or annotated. Executors whose status
        writes nothing need not override it."""
        return self.status(handle)

    def image_digest(self, handle: Handle) -> str:
        """The digest of the image the runner runs in, as the container runtime reports
        it (``sha256:...``); "" when unknown or not an image (the local executor)."""
        return ""


def get_executor(name: str | None = None) -> Executor:
    """The executor called ``name`` (default: settings.SERVEBENCH_EXECUTOR)."""
    name = name or settings.SERVEBENCH_EXECUTOR
    try:
        path = EXECUTORS[name]
    except KeyError:
        raise ExecutorError(
            f"unknown executor {name!r}; set SERVEBENCH_EXECUTOR to one of {', '.join(EXECUTORS)}"
        ) from None
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ExecutorError(f"executor {name!r} is not available in this version ({exc})") from None
    return cls()


def report_url(run: Run) -> str:
    """The run's ingestion base URL the runner posts events and measurements to."""
    return f"{settings.SERVEBENCH_PUBLIC_URL}/api/v1/runner/runs/{run.public_id}"
