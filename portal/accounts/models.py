"""API tokens. Users themselves are Django's ``auth.User``."""

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
