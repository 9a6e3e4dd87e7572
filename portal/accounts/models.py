"""API tokens and fair-use quotas. Users themselves are Django's ``auth.User``."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiToken(models.Model):
    """A bearer token, stored as a lookup prefix plus an HMAC of the whole token.

    The plaintext (``sb_ci_...`` or ``sb_run_...``) is shown once, at creation, and never
    stored. ``kind`` says what the token may do:

    - ``ci``: act as its user on the REST API (submit, list, read, cancel).
    - ``run``: write measurements and events to one run (``run``) only; created by
      dispatch for the runner, expires after the run's deadline.
    """

    class Kind(models.TextChoices):
        CI = "ci", "CI / API"
        RUN = "run", "Runner (one run)"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    run = models.ForeignKey(
        "benchmarks.Run",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="tokens",
        help_text="Set for run-scoped tokens: the only run this token may write to.",
    )
    kind = models.CharField(max_length=8, choices=Kind.choices, default=Kind.CI)
    name = models.CharField(max_length=100, blank=True)
    lookup = models.CharField(max_length=16, help_text="First characters of the secret part.")
    digest = models.CharField(max_length=64, help_text="Hex HMAC-SHA256 of the whole token.")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Fair use (portal.accounts.quotas), set by an admin; empty: the settings' defaults
    # for tokens (SERVEBENCH_QUOTA_TOKEN_*) and the owner's priority.
    priority = models.SmallIntegerField(
        null=True,
        blank=True,
        help_text="Queue priority of runs submitted with this token (empty: the owner's).",
    )
    max_active_runs = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Queued + running runs this token may have (empty: the default; 0: none).",
    )
    gpu_hours_per_day = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="GPU-hours this token's runs may take in any 24 h (empty: the default).",
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Authentication: WHERE lookup = %s on every API request with a bearer token.
            models.Index(fields=["lookup"], name="apitoken_lookup"),
            # The token list on a user's settings page: WHERE user_id = %s ORDER BY created_at.
            models.Index(fields=["user", "-created_at"], name="apitoken_user_created"),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}{self.lookup}… ({self.name or self.get_kind_display()})"

    @property
    def prefix(self) -> str:
        return PREFIXES[self.kind]

    @property
    def is_active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()


# What a token's plaintext starts with, by kind (``portal.accounts.tokens`` issues and
# parses them).
PREFIXES = {ApiToken.Kind.CI: "sb_ci_", ApiToken.Kind.RUN: "sb_run_"}


class Quota(models.Model):
    """An admin's fair-use settings for one user, over the settings' defaults
    (``SERVEBENCH_QUOTA_*``): an empty limit is the default; 0 for a limit means no runs.

    ``priority`` orders the queue: the dispatcher takes higher priorities first, first
    come, first served within one (``portal.dispatch.dispatcher.fill_slots``). Users
    without a row have priority 0 and the default limits.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="quota"
    )
    max_active_runs = models.PositiveIntegerField(
        null=True, blank=True, help_text="Queued + running runs (empty: the default)."
    )
    gpu_hours_per_day = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="GPU-hours in any 24 h: gpu_count x timeout while a run waits or runs, "
        "the GPU time it held once it ended (empty: the default).",
    )
    unlimited = models.BooleanField(
        default=False, help_text="No limits at all (service accounts, the admins' own runs)."
    )
    priority = models.SmallIntegerField(
        default=0, help_text="Higher runs first; runs of equal priority, oldest first."
    )
    note = models.CharField(max_length=200, blank=True, help_text="Why (for other admins).")

    def __str__(self) -> str:
        return f"quota of {self.user}"


# The permission's full name, as ``user.has_perm`` takes it.
TRUST_REMOTE_CODE = "accounts.trust_remote_code"


class Grant(models.Model):
    """Holds permissions that are about what a user's runs may do, not about a table.

    ``trust_remote_code``: the user's specs may set ``model.trust_remote_code: true``, so
    the runner executes Python code from the model's repository. Off for everyone by
    default; an admin grants it per user or group in the Django admin (Users ->
    permissions: "accounts | grant | May run a model's own code"). No table.
    """

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("trust_remote_code", "May run a model's own code (model.trust_remote_code)"),
        ]

    def __str__(self) -> str:
        return "grant"
