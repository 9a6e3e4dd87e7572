"""The runner's log tail, for its readers: the one function the run page and
``GET /api/v1/runs/{id}/logs`` both call.

Only who manages the run (``queries.may_manage``: the owner and staff) reads it: a log
names paths, hosts and models a public run's readers need not see. Reading never changes
anything: the executor's ``logs`` and ``observe`` only read (a GET must not stop a Job).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from portal.benchmarks import queries, sharing
from portal.benchmarks.models import Run
from portal.dispatch.executors import ExecutorError, get_executor

log = logging.getLogger(__name__)

DEFAULT_TAIL = 100
MAX_TAIL = 2000


@dataclass(frozen=True)
class LogTail:
    """``text``: the last lines ("" when there are none); ``note``: why there are none,
    when the executor knows (e.g. "waiting for a GPU: ..."); ``error``: the executor could
    not be asked; ``source``: the executor's name."""

    text: str
    source: str
    note: str = ""
    error: str = ""


def log_tail(user: Any, run: Run, tail: int = DEFAULT_TAIL) -> LogTail | None:
    """The last ``tail`` lines of the run's runner output, or None when ``user`` may not
    read them. Credentials in the text are redacted (``sharing.scrub``)."""
    if not queries.may_manage(user, run):
        return None
    tail = max(1, min(int(tail), MAX_TAIL))
    if not run.executor_handle:
        note = (
            "the run never reached an executor"
            if run.is_final
            else "the run has not been submitted to an executor yet"
        )
        return LogTail("", run.executor, note=note)
    try:
        executor = get_executor(run.executor or None)
    except ExecutorError as exc:
        return LogTail("", run.executor, error=str(exc))
    try:
        text = executor.logs(run.executor_handle, tail=tail) or ""
    except ExecutorError as exc:
        return LogTail("", executor.name, error=f"the runner's log could not be read: {exc}")
    note = ""
    if not text and not run.is_final:
        try:
            note = executor.observe(run.executor_handle).reason
        except ExecutorError as exc:  # unreachable: say so instead of failing the page
            note = str(exc)
    return LogTail(sharing.scrub(text), executor.name, note=note)
