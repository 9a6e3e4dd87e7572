"""Counters every portal process shares, in Redis (``SERVEBENCH_COUNTERS_URL``).

- **Windows** (``hit``, ``peek``, ``clear``): fixed-window counts for rate limits: the
  API's throttles (``portal.api.throttling``) and failed sign-ins
  (``portal.accounts.signin``). One ``INCR`` + ``EXPIRE`` round trip per counted event;
  a key lives one window.
- **Totals** (``add``, ``totals``): monotonic event counts by one label, for ``/metrics``
  (``portal.ops.metrics``): HTTP 5xx answers by status, ingestion refusals by field.
  A counter that restarts from zero (Redis flushed) is what Prometheus' ``rate()``
  expects of a counter anyway.

Per-process memory would not do: gunicorn runs several workers per pod and the chart
several pods, and a limit each of them counted alone would be that many times the limit.

Redis is asked with a short timeout (``TIMEOUT``), and when it does not answer these
functions let the request through (``hit`` returns None, ``add`` drops the count) and log
once a minute: a Redis outage must cost the portal its limits, not every request.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings

log = logging.getLogger(__name__)

TIMEOUT = 0.5  # seconds, to connect and per command
_local = threading.local()
_last_warning = 0.0


def _client() -> redis.Redis:
    client = getattr(_local, "client", None)
    url = settings.SERVEBENCH_COUNTERS_URL
    if client is None or getattr(_local, "url", None) != url:
        client = redis.Redis.from_url(
            url, socket_timeout=TIMEOUT, socket_connect_timeout=TIMEOUT, retry_on_timeout=False
        )
        _local.client, _local.url = client, url
    return client


def _key(*parts: str) -> str:
    return ":".join([settings.SERVEBENCH_COUNTERS_PREFIX, *parts])


def _unavailable(exc: Exception) -> None:
    global _last_warning
    now = time.monotonic()
    if now - _last_warning > 60:
        _last_warning = now
        log.warning("counters: Redis did not answer (%s); limits are not enforced", exc)


@dataclass(frozen=True)
class Window:
    """A window's count after this event, and the seconds until the window ends."""

    count: int
    resets_in: int


def window_start(seconds: int, now: float) -> int:
    """The start of the fixed window of ``seconds`` that holds ``now`` (epoch seconds):
    windows start at multiples of their length."""
    return int(now // seconds) * seconds


def _window(scope: str, ident: str, seconds: int, now: float) -> tuple[str, int]:
    start = window_start(seconds, now)
    return _key("w", scope, str(seconds), str(start), ident), start + seconds - int(now)


def hit(scope: str, ident: str, seconds: int, amount: int = 1) -> Window | None:
    """Count one event of ``ident`` in ``scope``'s current window of ``seconds``; None
    when Redis does not answer."""
    key, resets_in = _window(scope, ident, seconds, time.time())
    try:
        pipe = _client().pipeline(transaction=False)
        pipe.incrby(key, amount)
        pipe.expire(key, seconds + 1)
        count, _ = pipe.execute()
    except redis.RedisError as exc:
        _unavailable(exc)
        return None
    return Window(int(count), max(1, resets_in))


def claim(name: str, seconds: float, holder: str) -> bool | None:
    """Take ``name`` for ``seconds`` unless someone holds it (``SET NX PX``, expiring on its
    own, so a holder that dies holds nothing for long): True taken, False held by another,
    None when Redis does not answer."""
    try:
        taken = _client().set(_key("claim", name), holder, nx=True, px=max(1, int(seconds * 1000)))
    except redis.RedisError as exc:
        _unavailable(exc)
        return None
    return bool(taken)


def peek(scope: str, ident: str, seconds: int) -> Window | None:
    """The current window's count without counting; None when Redis does not answer."""
    key, resets_in = _window(scope, ident, seconds, time.time())
    try:
        value = _client().get(key)
    except redis.RedisError as exc:
        _unavailable(exc)
        return None
    return Window(int(value or 0), max(1, resets_in))


def clear(scope: str, ident: str, seconds: int) -> None:
    """Forget ``ident``'s current window (a successful sign-in)."""
    key, _ = _window(scope, ident, seconds, time.time())
    try:
        _client().delete(key)
    except redis.RedisError as exc:
        _unavailable(exc)


def clear_all_windows() -> int:
    """Delete every window of this deployment (tests start each from zero); the count."""
    deleted = 0
    try:
        client = _client()
        batch = []
        for key in client.scan_iter(match=_key("w", "*"), count=500):
            batch.append(key)
            if len(batch) >= 500:
                deleted += client.delete(*batch)
                batch = []
        if batch:
            deleted += client.delete(*batch)
    except redis.RedisError as exc:
        _unavailable(exc)
    return deleted


# Labels a total may hold at most: a label comes from requests (a refused field's name),
# so its count is bounded; the rest are counted under "other".
MAX_LABELS = 200


def add(name: str, label: str, amount: int = 1) -> None:
    """Count ``amount`` events of ``name`` under ``label``; dropped when Redis does not
    answer."""
    key = _key("total", name)
    try:
        client = _client()
        if not client.hexists(key, label) and client.hlen(key) >= MAX_LABELS:
            label = "other"
        client.hincrby(key, label, amount)
    except redis.RedisError as exc:
        _unavailable(exc)


def totals(name: str) -> dict[str, int] | None:
    """Every label's count of ``name``; None when Redis does not answer."""
    try:
        raw: dict[Any, Any] = _client().hgetall(_key("total", name))
    except redis.RedisError as exc:
        _unavailable(exc)
        return None
    return {k.decode(): int(v) for k, v in raw.items()}
