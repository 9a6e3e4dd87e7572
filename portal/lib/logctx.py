"""Put the current run's short id on every log line (``[run=abcd1234]``).

``bound_run(public_id)`` sets it for a block (a task, a request on a run); the
``RunIdFilter`` in the LOGGING config copies it onto each record as ``%(run)s``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar

_current: ContextVar[str] = ContextVar("servebench_run", default="-")


def short(public_id: str) -> str:
    """The first 8 characters of a public id: what logs and people quote."""
    return public_id[:8]


@contextlib.contextmanager
def bound_run(public_id: str) -> Iterator[None]:
    token = _current.set(short(public_id))
    try:
        yield
    finally:
        _current.reset(token)


class RunIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "run"):
            record.run = _current.get()
        return True
