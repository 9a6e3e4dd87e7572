"""Sending a Celery task by name from a request (or any path a person waits on), bounded.

A broker that is down refuses a connection at once, but a hung one (a Redis stopped with
SIGSTOP, a full disk, a half-dead network) accepts the TCP connection and never answers:
with the default client settings a send waits for the kernel's timeouts, and a
``POST /runs/`` once waited 30 s on a Redis paused for 30 s. Every send here uses a
connection of its own with ``SEND_TIMEOUT`` on connecting and on each socket operation, and
no retries, so a request waits at most a couple of seconds whatever the broker does.

A send that fails is only logged (once a minute at most): the state lives in PostgreSQL,
and the periodic tasks that read it (reconcile for dispatch and stop, the alerts scan for
deliveries) send again on their next pass, so the run stays queued and is dispatched later.
"""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger(__name__)

SEND_TIMEOUT = 1.5  # seconds: to connect, and per socket operation of the send
_last_warning: dict[str, float] = {}


def send(task: str, args: list[Any], what: str, *, retried_by: str = "reconcile") -> bool:
    """Enqueue ``task`` (by name) with ``args``; False (logged) when the broker did not take
    it within ``SEND_TIMEOUT``. ``what`` and ``retried_by`` name the message and what
    sends it again, for the log."""
    from portal.celery import app

    started = time.monotonic()
    options = {
        "socket_timeout": SEND_TIMEOUT,
        "socket_connect_timeout": SEND_TIMEOUT,
        "max_retries": 0,
    }
    try:
        with app.connection_for_write(
            connect_timeout=SEND_TIMEOUT, transport_options=options
        ) as connection:
            app.send_task(task, args=args, retry=False, connection=connection)
    except Exception as exc:  # the broker's many exception types; the next pass re-sends
        now = time.monotonic()
        if now - _last_warning.get(task, 0.0) > 60:
            _last_warning[task] = now
            log.warning(
                "could not enqueue %s in %.1f s (%s: %s); %s will send it again",
                what,
                now - started,
                type(exc).__name__,
                exc,
                retried_by,
            )
        return False
    return True
