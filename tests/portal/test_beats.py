"""Two beats at once run each periodic task once per period (``portal.ops.beat``).

Two real Celery workers, each with its own embedded beat (``-B``), on the real Redis and
this session's database: both beats send ``servebench.reconcile`` every period, and the
workers' logs say which messages ran and which were skipped.
"""

from __future__ import annotations

import re
import time

import pytest

from portal.ops import beat, counters

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

PERIOD = 2
DONE = re.compile(r"Task servebench\.reconcile\[[^\]]+\] succeeded in [\d.]+s: (\{.*\})")


def outcomes(*workers) -> tuple[int, int]:
    """(reconciles that ran, reconciles skipped) in the workers' logs."""
    ran = skipped = 0
    for worker in workers:
        for result in DONE.findall(worker.output()):
            if result.startswith("{'skipped'"):
                skipped += 1
            else:
                ran += 1
    return ran, skipped


def test_two_beats_reconcile_once_per_period(celery_worker):
    first = celery_worker(beat=True, reconcile_seconds=PERIOD)
    second = celery_worker(beat=True, reconcile_seconds=PERIOD)
    ran_before, skipped_before = outcomes(first, second)
    window = 8 * PERIOD
    time.sleep(window)
    ran, skipped = outcomes(first, second)
    ran, skipped = ran - ran_before, skipped - skipped_before
    # One reconcile per period (give or take the window's edges), not one per beat.
    assert ran <= window / PERIOD + 2, (ran, skipped)
    assert ran >= window / PERIOD - 2, (ran, skipped)
    assert skipped >= window / PERIOD - 3, (ran, skipped)  # both beats did send


def test_the_first_message_of_a_period_runs_and_the_next_is_skipped(settings):
    settings.SERVEBENCH_COUNTERS_PREFIX = f"beats-test-{time.time_ns()}"
    assert beat.first_this_period("reconcile", 1.0)
    assert not beat.first_this_period("reconcile", 1.0)
    assert beat.first_this_period("alerts", 1.0)  # one key per task
    time.sleep(beat.SHARE + 0.1)
    assert beat.first_this_period("reconcile", 1.0)  # the claim expired on its own


def test_without_redis_the_task_runs_anyway(settings):
    settings.SERVEBENCH_COUNTERS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    assert counters.claim("beat:reconcile", 1.0, "me") is None
    assert beat.first_this_period("reconcile", 1.0)
