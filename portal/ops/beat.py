"""One run of each periodic task per period, however many beats send it.

Two Celery beats (two `make run`s on one Redis, a Helm upgrade's old and new beat pods
side by side, a beat embedded in a worker next to the real one) each send every periodic
task: without this, reconcile ran twice per period, twice as many re-sent dispatches,
twice the executor queries. Each periodic task asks ``first_this_period`` before its work:
a Redis key per task (``counters.claim``: ``SET NX`` with an expiry of ``SHARE`` of the
period) lets the first message of a period through and skips the others, so beats cannot
collide whatever their phase, and no beat has to be elected or watched.

When Redis does not answer the task runs anyway: its message came through Redis, so an
outage there means no second message either, and every periodic task is safe to run
twice (conditional updates); this only stops the waste and the noise.
"""

from __future__ import annotations

import logging
import os
import socket

from portal.ops import counters

log = logging.getLogger(__name__)

SHARE = 0.8  # of the period: a late first message never makes the next period's skip


def first_this_period(task: str, period_s: float) -> bool:
    """Whether this message of ``task`` is the first of its period (then it runs)."""
    holder = f"{socket.gethostname()}:{os.getpid()}"
    taken = counters.claim(f"beat:{task}", period_s * SHARE, holder)
    if taken is False:
        log.info("%s: another beat's message ran this period; skipped", task)
        return False
    return True
