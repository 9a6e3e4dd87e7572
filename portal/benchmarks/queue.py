"""Where a queued run stands: runs ahead of it and the executor's slots.

The queue's order is the dispatcher's (``CLAIM_ORDER``): higher ``Run.priority`` first (an
admin's grant to a user or a CI token: ``portal.accounts.quotas``), then first come, first
served. The local executor starts at most ``SERVEBENCH_LOCAL_SLOTS`` runners at once
(``portal.dispatch.dispatcher.fill_slots``); a queued run waits for a slot, visibly. On
Kubernetes there are no slots here: the cluster's scheduler decides (priority only orders
the dispatches), and a run waiting for a GPU is ``dispatched`` with the scheduler's reason
(``GET /api/v1/runs/{id}/logs``' note, and the run page).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Q

from portal.benchmarks.models import Run, RunStatus

# The order queued runs are claimed in (served by the index ``run_queue_order``).
CLAIM_ORDER = ("-priority", "created_at", "id")


def ahead_of(run: Run) -> Q:
    """The queued runs the dispatcher takes before ``run``: a higher priority, or the same
    priority and older."""
    return Q(status=RunStatus.QUEUED) & (
        Q(priority__gt=run.priority)
        | Q(priority=run.priority, created_at__lt=run.created_at)
        | Q(priority=run.priority, created_at=run.created_at, pk__lt=run.pk)
    )


def slots() -> int | None:
    """The executor's slots (None: the executor's own scheduler decides)."""
    return settings.SERVEBENCH_LOCAL_SLOTS if settings.SERVEBENCH_EXECUTOR == "local" else None


def queue_info(run: Run) -> dict[str, Any] | None:
    """For a queued run: ``{position, ahead, slots, busy, message}`` (two small queries);
    None for any other status."""
    if run.status != RunStatus.QUEUED:
        return None
    ahead = Run.objects.filter(ahead_of(run)).count()
    total = slots()
    busy = Run.objects.filter(holds_slot=True).count() if total is not None else None
    runs = "run" if ahead == 1 else "runs"
    if total is None:
        message = f"waiting to be dispatched; {ahead} {runs} ahead of it"
    elif ahead == 0 and busy is not None and busy < total:
        message = "next: it starts as soon as a worker picks it up"
    else:
        message = (
            f"waiting for a free slot: {ahead} {runs} ahead of it, {busy} of {total} "
            f"slot{'s' if total != 1 else ''} busy (one benchmark at a time owns this machine)"
        )
    if run.priority:
        message += f" (priority {run.priority})"
    return {
        "position": ahead + 1,
        "ahead": ahead,
        "slots": total,
        "busy": busy,
        "priority": run.priority,
        "message": message,
    }
