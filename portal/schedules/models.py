"""Schedules: a spec submitted on a cadence and labelled into a series, so the series'
history builds itself; and each firing, with the run it made or why it was refused."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from portal.benchmarks.models import BASELINE_LABEL_MAX, Run, new_public_id


class Cadence(models.TextChoices):
    DAILY = "daily", "Every day at HH:MM UTC"
    HOURS = "hours", "Every N hours"


class Schedule(models.Model):
    """``owner``'s ``spec``, submitted through the normal intake (fair use applies) at
    every slot of its cadence (``portal.schedules.cadence``) and labelled ``label``.

    ``next_run_at`` is the next slot; the beat tick claims a due schedule by moving it
    forward with a conditional update, in the transaction that submits the run
    (``portal.schedules.firing``). A refused submit is recorded (``last_error``, a
    ``Firing``) and notifies the series' subscribers.
    """

    public_id = models.CharField(max_length=20, unique=True, default=new_public_id, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="schedules"
    )
    name = models.CharField(max_length=200)
    spec = models.JSONField(help_text="The validated spec with defaults filled in.")
    label = models.CharField(max_length=BASELINE_LABEL_MAX)
    is_public = models.BooleanField(default=False, help_text="Its runs are public.")
    cadence = models.CharField(max_length=8, choices=Cadence.choices)
    at_time = models.TimeField(
        help_text="daily: the time of day (UTC); hours: where the N-hour slots start."
    )
    every_hours = models.PositiveSmallIntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    next_run_at = models.DateTimeField()
    last_fired_at = models.DateTimeField(null=True, blank=True)
    last_run = models.ForeignKey(
        Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The beat tick: WHERE enabled AND next_run_at <= now() ORDER BY next_run_at.
            models.Index(fields=["next_run_at"], condition=Q(enabled=True), name="schedule_due"),
            # The schedules page: WHERE owner_id = %s ORDER BY created_at DESC.
            models.Index(fields=["owner", "-created_at"], name="schedule_owner_created"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.describe()})"

    def describe(self) -> str:
        at = self.at_time.strftime("%H:%M")
        if self.cadence == Cadence.DAILY:
            return f"daily at {at} UTC"
        return f"every {self.every_hours} h from {at} UTC"


class Firing(models.Model):
    """One slot of a schedule: the run it submitted, or why none was (``refusal``)."""

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="firings")
    due_at = models.DateTimeField()
    fired_at = models.DateTimeField(default=timezone.now)
    run = models.ForeignKey(
        Run, on_delete=models.SET_NULL, null=True, blank=True, related_name="schedule_firings"
    )
    refusal = models.TextField(blank=True)

    class Meta:
        ordering = ["-due_at"]
        constraints = [
            # A slot fires once, whatever two beats do; its index serves the history list.
            models.UniqueConstraint(fields=["schedule", "due_at"], name="firing_schedule_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.due_at:%Y-%m-%d %H:%M}"
