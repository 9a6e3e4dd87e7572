"""Failpoints: named places where a test makes this process die, to prove crash safety.

``SERVEBENCH_FAILPOINTS=dispatch.after-claim`` (comma-separated names) makes ``hit(name)``
SIGKILL this process's whole process group at that place, exactly as a node losing power
or the OOM killer would: no ``finally``, no cleanup, no acknowledgement to the broker.
The fault-injection tests (tests/portal/test_faults.py) set it on a Celery worker they
start; nothing else does. Unset, ``hit`` costs one dictionary lookup.

Names in use: ``dispatch.before-claim``, ``dispatch.after-claim``,
``dispatch.after-start``.
"""

from __future__ import annotations

import logging
import os
import signal

ENV = "SERVEBENCH_FAILPOINTS"
log = logging.getLogger(__name__)


def hit(name: str) -> None:
    """Die here if the failpoint ``name`` is enabled."""
    enabled = os.environ.get(ENV)
    if not enabled or name not in enabled.split(","):
        return
    log.warning("failpoint %s: killing this process group now", name)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.killpg(os.getpgid(0), signal.SIGKILL)
