"""Webhook signatures: what a receiver checks to know a delivery came from this portal.

Every webhook delivery carries

    X-Servebench-Delivery: <uuid>          the same on every retry of one delivery
    X-Servebench-Timestamp: <unix seconds>  when this attempt was sent
    X-Servebench-Signature: sha256=<hex>    HMAC-SHA256(secret, "<timestamp>.<body>")

A receiver recomputes the HMAC over the timestamp, a dot and the raw body with its
subscription's secret, compares in constant time, and refuses timestamps older than a few
minutes (a replayed request). ``verify`` is that check, for receivers written in Python
and for the tests.

The secret (``whsec_...``) is shown once, when the subscription is created. The database
keeps only a random salt: the secret is an HMAC of it under the API tokens' key
(``portal.accounts.tokens.digest``, ``SERVEBENCH_TOKEN_KEY``), so a copy of the database
alone cannot sign. Rotating that key changes every webhook secret, as it revokes every
API token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from portal.accounts.tokens import digest

PREFIX = "whsec_"
TOLERANCE_SECONDS = 300


def new_salt() -> str:
    return secrets.token_urlsafe(24)


def signing_secret(salt: str) -> str:
    """The secret receivers hold, derived from the stored salt."""
    return PREFIX + digest(f"servebench-webhook-secret:{salt}")[:48]


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def headers(secret: str, delivery_id: str, event: str, body: bytes) -> dict[str, str]:
    """The headers of one attempt (a fresh timestamp and signature each time)."""
    now = int(time.time())
    return {
        "X-Servebench-Event": event,
        "X-Servebench-Delivery": delivery_id,
        "X-Servebench-Timestamp": str(now),
        "X-Servebench-Signature": signature(secret, now, body),
    }


def verify(secret: str, body: bytes, timestamp: str, header: str, now: float | None = None) -> bool:
    """A receiver's check: the signature matches and the timestamp is recent."""
    try:
        sent = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs((now if now is not None else time.time()) - sent) > TOLERANCE_SECONDS:
        return False
    return hmac.compare_digest(signature(secret, sent, body), header or "")
