"""When a labelled run succeeds: judge it against its series' previous run, and turn a
regression (or a schedule's refused submit) into deliveries.

``scan()`` (the beat task ``servebench.alerts.scan``, every minute) finds the labels of
runs that succeeded in the last ``LOOKBACK`` and have no ``SeriesCheck`` yet, whichever
came last: the run's end or its label (CI often labels a run after it finished). For each
(run, label), ``judge`` resolves the series' previous run exactly as ``latest:<label>``
does for a gate (``baselines.resolve``: the same owner's newest succeeded run of that
fingerprint and label created before this one) and compares the two with the one verdict
engine (``compare.compare``, as the compare page and the CLI). A run with any ``worse``
verdict among the counted metrics is a regression; every enabled subscription of the
series (the owner and label, the fingerprint if the subscription names one) whose user
may read the run gets one ``Delivery``.

Exactly once: the check row is unique per (run, label) and created in the same
transaction as its deliveries, which are unique per (subscription, event key); the send
tasks are enqueued after commit, and a scan re-sends deliveries whose message was lost.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from portal.alerts.models import Delivery, DeliveryStatus, SeriesCheck, Subscription
from portal.benchmarks import baselines, compare, queries
from portal.benchmarks.models import Baseline, Run, RunStatus
from portal.lib import broker
from servebench import verdict as engine

log = logging.getLogger(__name__)

LOOKBACK = timedelta(days=2)
BATCH = 50
MAX_LISTED = 20
# A pending delivery whose send message was lost is sent again after this long.
RESEND_AFTER = timedelta(minutes=10)


def enqueue_delivery(delivery_id: str) -> None:
    """Send the delivery task (by name); a broker outage only delays it: ``scan`` re-sends
    pending deliveries."""
    broker.send(
        "servebench.alerts.deliver",
        [delivery_id],
        f"alert delivery {delivery_id}",
        retried_by="the alerts scan",
    )


def _url(path: str) -> str:
    return f"{settings.SERVEBENCH_PUBLIC_URL}{path}"


def _run_facts(run: Run) -> dict[str, Any]:
    return {
        "id": run.public_id,
        "name": run.name,
        "model": run.model_id,
        "gpu": run.gpu_name,
        "created_at": run.created_at.isoformat(),
        "url": _url(run.get_absolute_url()),
    }


def _worse_rows(comparison: compare.Comparison, i: int) -> list[dict[str, Any]]:
    out = []
    for row in comparison.rows:
        judgement = row.judgements[i] if row.judgements else None
        if judgement is None or judgement.verdict != engine.WORSE:
            continue
        out.append(
            {
                "backend": row.point.backend,
                "point": row.point.point_key,
                "metric": row.metric.key,
                "previous": row.values[comparison.baseline],
                "value": row.values[i],
                "change": row.deltas[i],
            }
        )
    return out


def _describe(run: Run, label: str, previous: Run, worse: list[dict[str, Any]]) -> str:
    lines = [
        f"servebench: {run.name or run.model_id} ({run.short_id}) is worse than the previous "
        f"run of {run.owner.get_username()}'s series {label!r} ({previous.short_id}):"
    ]
    for row in worse[:5]:
        change = f"{row['change']:+.1%}" if row["change"] is not None else "changed"
        lines.append(f"- {row['metric']} at {row['backend']} {row['point']}: {change}")
    if len(worse) > 5:
        lines.append(f"- and {len(worse) - 5} more")
    query = f"?runs={previous.public_id},{run.public_id}&baseline={previous.public_id}"
    lines.append(f"Compare: {_url('/compare/')}{query}")
    return "\n".join(lines)


def judge(run: Run, label: str) -> SeriesCheck | None:
    """Judge ``run`` (succeeded, labelled ``label``) once; None if it was already judged."""
    owner = run.owner
    previous = None
    comparison = None
    try:
        previous = baselines.resolve(
            owner,
            f"{baselines.LATEST}{label}",
            fingerprint=run.fingerprint,
            before=run.public_id,
        )
    except baselines.BaselineError:
        verdict, summary, counts, worse = "first", "no earlier succeeded run in the series", {}, []
    if previous is not None:
        try:
            comparison = compare.compare(
                owner, [previous.public_id, run.public_id], previous.public_id
            )
        except Exception as exc:  # a run the engine cannot read: said, never retried forever
            log.exception("alerts: could not compare %s with %s", run.short_id, previous.short_id)
            verdict, summary, counts, worse = "failed", f"compare failed: {exc!r}", {}, []
        else:
            counts = comparison.counts(1)
            worse = _worse_rows(comparison, 1)
            verdict = "worse" if counts.get(engine.WORSE) else "ok"
            summary = _describe(run, label, previous, worse) if verdict == "worse" else ""
    with transaction.atomic():
        try:
            with transaction.atomic():
                check = SeriesCheck.objects.create(
                    run=run,
                    label=label,
                    reference=previous,
                    verdict=verdict,
                    counts=counts,
                    summary=summary,
                )
        except IntegrityError:
            return None  # another scan judged it first
        if verdict == "worse" and previous is not None:
            payload = {
                "event": "regression",
                "text": summary,
                "series": {
                    "owner": owner.get_username(),
                    "label": label,
                    "fingerprint": run.fingerprint,
                },
                "run": _run_facts(run),
                "previous": _run_facts(previous),
                "compare_url": _url(
                    f"/compare/?runs={previous.public_id},{run.public_id}"
                    f"&baseline={previous.public_id}"
                ),
                "verdicts": counts,
                "worse": worse[:MAX_LISTED],
            }
            notify(
                run.owner,
                label,
                run.fingerprint,
                "regression",
                f"regression:{run.pk}:{label}",
                payload,
                run=run,
            )
    log.info("alerts: %s labelled %s judged %s", run.short_id, label, verdict)
    return check


def notify(
    owner: Any,
    label: str,
    fingerprint: str,
    event: str,
    key: str,
    payload: dict[str, Any],
    *,
    run: Run | None = None,
) -> list[Delivery]:
    """A delivery for each enabled subscription of (``owner``, ``label``) (to every series
    of the label, or to ``fingerprint``'s; every one when ``fingerprint`` is "") whose user
    may read ``run``; created once per ``key``, and sent after commit."""
    subs = Subscription.objects.filter(series_owner=owner, label=label, enabled=True)
    subs = subs.filter(Q(fingerprint="") | Q(fingerprint=fingerprint)) if fingerprint else subs
    made = []
    for sub in subs.select_related("user"):
        if run is not None and not queries.may_view(sub.user, run):
            continue
        delivery, created = Delivery.objects.get_or_create(
            subscription=sub,
            dedupe_key=key[:200],
            defaults={"channel": sub.channel, "event": event, "run": run, "payload": payload},
        )
        if created:
            made.append(delivery)
    for delivery in made:
        transaction.on_commit(
            lambda pk=str(delivery.pk): enqueue_delivery(pk),
            robust=True,
        )
    return made


def due(now: datetime | None = None) -> list[Baseline]:
    """Labels of succeeded runs ended in the last LOOKBACK that were not judged yet."""
    now = now or timezone.now()
    judged = SeriesCheck.objects.filter(run=OuterRef("run"), label=OuterRef("label"))
    return list(
        Baseline.objects.filter(
            run__status=RunStatus.SUCCEEDED, run__finished_at__gte=now - LOOKBACK
        )
        .exclude(Exists(judged))
        .select_related("run__owner")
        .order_by("run__finished_at", "run_id", "label")[:BATCH]
    )


def scan(now: datetime | None = None) -> dict[str, list[str]]:
    """Judge what is due and re-send lost deliveries: what was judged, what re-sent."""
    now = now or timezone.now()
    judged = []
    for mark in due(now):
        check = judge(mark.run, mark.label)
        if check is not None:
            judged.append(f"{mark.run.public_id}:{mark.label}:{check.verdict}")
    lost = Delivery.objects.filter(
        status=DeliveryStatus.PENDING, next_attempt_at__lt=now - RESEND_AFTER
    ).values_list("pk", flat=True)[:200]
    resent = [str(pk) for pk in lost]
    for pk in resent:
        Delivery.objects.filter(pk=pk, status=DeliveryStatus.PENDING).update(next_attempt_at=now)
        enqueue_delivery(pk)
    return {"judged": judged, "resent": resent}
