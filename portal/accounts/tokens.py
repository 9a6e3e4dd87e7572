"""Issue, verify and revoke API tokens (see ``ApiToken``).

A token is ``<prefix><secret>``: ``sb_ci_`` for a user's CI/API token, ``sb_run_`` for a
runner's token scoped to one run; the secret is 43 url-safe random characters. The
database keeps the secret's first 10 characters (to find the row) and an HMAC-SHA256 of the
whole token keyed with ``SERVEBENCH_TOKEN_KEY`` (or a key derived from ``SECRET_KEY``);
verification compares HMACs in constant time.

Web views call ``create_user_token(user, name)`` and show the returned plaintext once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from portal.accounts.models import PREFIXES, ApiToken

LOOKUP_CHARS = 10
# Writing last_used_at on every request would turn each API read into a write.
LAST_USED_RESOLUTION = timedelta(seconds=60)


@dataclass(frozen=True)
class IssuedToken:
    """A new token: the row, and the plaintext to show once."""

    token: ApiToken
    plaintext: str


def _key() -> bytes:
    if settings.SERVEBENCH_TOKEN_KEY:
        return settings.SERVEBENCH_TOKEN_KEY.encode()
    return hashlib.sha256(b"servebench-api-token:" + settings.SECRET_KEY.encode()).digest()


def digest(plaintext: str) -> str:
    return hmac.new(_key(), plaintext.encode(), hashlib.sha256).hexdigest()


def issue_token(
    user: AbstractBaseUser,
    *,
    kind: str = ApiToken.Kind.CI,
    name: str = "",
    run: object | None = None,
    expires_at: datetime | None = None,
) -> IssuedToken:
    """Create a token row and return it with its plaintext (which is not stored)."""
    if kind == ApiToken.Kind.RUN and run is None:
        raise ValueError("a run token needs its run")
    secret = secrets.token_urlsafe(32)
    plaintext = PREFIXES[ApiToken.Kind(kind)] + secret
    token = ApiToken.objects.create(
        user=user,
        kind=kind,
        name=name[:100],
        run=run,
        lookup=secret[:LOOKUP_CHARS],
        digest=digest(plaintext),
        expires_at=expires_at,
    )
    return IssuedToken(token=token, plaintext=plaintext)


def create_user_token(user: AbstractBaseUser, name: str = "") -> IssuedToken:
    """A CI/API token for ``user`` (what the web's "new token" form and createtoken use)."""
    return issue_token(user, kind=ApiToken.Kind.CI, name=name)


def parse(plaintext: str) -> tuple[ApiToken.Kind, str] | None:
    """(kind, lookup) for a well-formed token, None for anything else."""
    for kind, prefix in PREFIXES.items():
        if plaintext.startswith(prefix):
            secret = plaintext[len(prefix) :]
            if len(secret) < LOOKUP_CHARS or len(secret) > 128:
                return None
            return kind, secret[:LOOKUP_CHARS]
    return None


def verify_token(plaintext: str) -> ApiToken | None:
    """The active token matching ``plaintext``, or None. Updates ``last_used_at``."""
    parsed = parse(plaintext)
    if parsed is None:
        return None
    kind, lookup = parsed
    expected = digest(plaintext)
    match = None
    for token in ApiToken.objects.filter(lookup=lookup, kind=kind).select_related("user"):
        if hmac.compare_digest(token.digest, expected):
            match = token
    if match is None or not match.is_active or not match.user.is_active:
        return None
    now = timezone.now()
    if match.last_used_at is None or now - match.last_used_at > LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=match.pk).update(last_used_at=now)
        match.last_used_at = now
    return match


def revoke_token(token: ApiToken) -> bool:
    """Revoke a token; False if it was already revoked."""
    now = timezone.now()
    done = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=now)
    if done:
        token.revoked_at = now
    return bool(done)
