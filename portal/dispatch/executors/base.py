"""The executor interface: what dispatch and reconcile need from "somewhere to run".

An executor starts one runner per run and can be asked about it later, from another
process, with nothing but the JSON ``handle`` it returned (stored on the Run):

- ``submit(run, token) -> handle``: start ``python -m runners run SPEC --report URL`` with
  the run-scoped token in the environment (``SERVEBENCH_RUN_TOKEN``, never argv). Must
  not wait for the benchmark. Raises ``ExecutorUnavailable`` for a transient problem
  (dispatch retries) and ``ExecutorError`` for a permanent one (the run fails with it).
- ``status(handle) -> ExecutorStatus``: ``pending`` (accepted, not started: pulling an
  image, waiting for a GPU), ``running``, ``succeeded`` / ``failed`` (the runner process
  ended with that exit status), or ``gone`` (nothing left to ask: the process or Job
  vanished). ``reason`` says why in words; ``exit_code`` when known.
- ``cancel(handle)``: stop it; idempotent, no error if it already ended.
- ``logs(handle, tail) -> str``: the last ``tail`` lines of the runner's output.

The portal's run status comes from the runner's own reports; the executor's state only
matters when the runner ended without reporting (reconcile fails the run with the
reason and the log tail) or the deadline passed (reconcile cancels it).
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

    @property
    def ended(self) -> bool:
        return self.state in (ExecutorState.SUCCEEDED, ExecutorState.FAILED, ExecutorState.GONE)


class ExecutorError(Exception):
    """The run cannot be started; the message is the run's failure reason."""


class ExecutorUnavailable(ExecutorError):
    """A transient problem (API server down, throttled): try again later."""


class Executor(abc.ABC):
    name: ClassVar[str]

    @abc.abstractmethod
    def submit(self, run: Run, token: str) -> Handle: ...

    @abc.abstractmethod
    def status(self, handle: Handle) -> ExecutorStatus: ...

    @abc.abstractmethod
    def cancel(self, handle: Handle) -> None: ...

    @abc.abstractmethod
    def logs(self, handle: Handle, tail: int = 50) -> str: ...


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
