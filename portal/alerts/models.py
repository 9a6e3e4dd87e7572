"""Alert subscriptions, the checks that judged a labelled run, and the deliveries they made.

A *labelled series* is one owner's runs with one fingerprint and one label
(``portal.benchmarks.baselines``). When a run of one succeeds, ``SeriesCheck`` records
that it was judged against the series' previous run (once per run and label: a unique
constraint, so two scanners cannot alert twice), and each matching ``Subscription`` gets a
``Delivery`` if the verdict engine found it worse.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.utils import timezone

from portal.benchmarks.models import BASELINE_LABEL_MAX, Run, new_public_id


class Channel(models.TextChoices):
    WEBHOOK = "webhook", "Webhook (signed JSON)"
    SLACK = "slack", "Slack-compatible webhook"
    EMAIL = "email", "Email"


class Subscription(models.Model):
    """``user`` hears about ``series_owner``'s runs labelled ``label`` (one series when
    ``fingerprint`` is set, every series of the label otherwise), on one channel.

    ``target`` is the URL (webhook, slack) or the address (email). A webhook's signing
    secret is derived from ``secret_salt`` and the token key (``secrets.signing_secret``):
    shown once when created, never stored in a readable form.
    """

    public_id = models.CharField(max_length=20, unique=True, default=new_public_id, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="alert_subscriptions"
    )
    series_owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+"
    )
    label = models.CharField(max_length=BASELINE_LABEL_MAX)
    fingerprint = models.CharField(max_length=64, blank=True)
    channel = models.CharField(max_length=16, choices=Channel.choices)
    target = models.CharField(max_length=500)
    secret_salt = models.CharField(max_length=64, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # Who to tell about a judged run: WHERE series_owner_id = %s AND label = %s.
            models.Index(fields=["series_owner", "label"], name="alertsub_series"),
            # The alerts page: WHERE user_id = %s ORDER BY created_at DESC.
            models.Index(fields=["user", "-created_at"], name="alertsub_user_created"),
        ]

    def __str__(self) -> str:
        return f"{self.user} <- {self.series_owner}:{self.label} ({self.channel})"


class SeriesCheck(models.Model):
    """A succeeded run of a labelled series, judged once against the previous run.

    ``verdict``: ``worse`` (deliveries made), ``ok``, ``first`` (no earlier succeeded run
    of the series), ``failed`` (the comparison could not be made; ``summary`` says why).
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="series_checks")
    label = models.CharField(max_length=BASELINE_LABEL_MAX)
    reference = models.ForeignKey(
        Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    verdict = models.CharField(max_length=16)
    counts = models.JSONField(default=dict, blank=True)
    summary = models.TextField(blank=True)
    checked_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-checked_at"]
        constraints = [
            # Judged once per run and label; its index also serves the scan's NOT EXISTS.
            models.UniqueConstraint(fields=["run", "label"], name="seriescheck_run_label"),
        ]

    def __str__(self) -> str:
        return f"{self.run.short_id} {self.label}: {self.verdict}"


class DeliveryStatus(models.TextChoices):
    """``pending -> delivered | failed``; a pending delivery is retried with backoff."""

    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


class Delivery(models.Model):
    """One notification to one subscription. ``id`` is the delivery id receivers see
    (``X-Servebench-Delivery``): the same on every retry, so they can drop duplicates.
    ``dedupe_key`` makes creating it idempotent."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    subscription = models.ForeignKey(
        Subscription, on_delete=models.CASCADE, related_name="deliveries"
    )
    channel = models.CharField(max_length=16, choices=Channel.choices)
    event = models.CharField(max_length=32)
    dedupe_key = models.CharField(max_length=200)
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, null=True, blank=True, related_name="alert_deliveries"
    )
    payload = models.JSONField()
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    last_error = models.TextField(blank=True)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["subscription", "dedupe_key"], name="delivery_subscription_key"
            ),
        ]
        indexes = [
            # The alerts page: WHERE subscription_id IN (...) ORDER BY created_at DESC.
            models.Index(fields=["subscription", "-created_at"], name="delivery_sub_created"),
            # The scan re-sends lost ones: WHERE status = 'pending' AND next_attempt_at < %s.
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(status="pending"),
                name="delivery_pending",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event} -> {self.subscription_id} ({self.status})"
