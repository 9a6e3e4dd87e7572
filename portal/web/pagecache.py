"""What the results pages compute from finished runs, computed once.

A finished run cannot change: no measurement, event or environment is accepted after
it ends. So the run page's figures, tables and rendered fragments of a finished run,
the compare page of finished runs and the history of a series are kept in the
``pages`` cache and reused: by default a per-process memory cache, bounded; with
``SERVEBENCH_PAGE_CACHE=redis`` (the Helm chart, ``make run``) one cache in Redis that
every web process shares (``SharedPages``), and a run's page is built into it when its
runner reports the end (``run_page.warm``), so even a reader's first visit is served warm.

Every key carries the stamps of what the value depends on, so there is nothing to
delete by hand: a run's ``updated_at``, which each write that can still touch a finished
run moves (sharing toggles, status changes: ``sharing.set_public``,
``lifecycle.transition``); for compare and history, a stamp of the series the verdict
reads its noise from (how many runs the reader sees in it, and the latest
``updated_at`` among them). ``VERSION`` changes when what is cached changes shape.
Unfinished runs are never cached: their pages are rebuilt on every request.

A finished run's own page is also kept in Postgres (``StoredPage``, ``run=`` below): the
cache forgets (a day's timeout, a restart, an eviction, or another process's memory),
and rebuilding a run's page from its measurements costs ~3x serving it. So a run's page
is built once, when the run ends (``portal.web.warm``) or for its first reader, and read
back from the table after the cache has forgotten it (one indexed query).
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import zlib
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

log = logging.getLogger(__name__)

ALIAS = "pages"
VERSION = 2  # 2: the reference picker, production traffic and "limited by" (this wave)
TIMEOUT_SECONDS = 24 * 3600  # a day: memory comes back for runs nobody reads any more

T = TypeVar("T")


def key(kind: str, *parts: Any) -> str:
    """A cache key from the page kind and the stamps its value depends on (hashed: keys
    stay short and free of user text)."""
    text = "|".join(_part(p) for p in parts)
    digest = hashlib.sha256(text.encode()).hexdigest()[:40]
    return f"sb:{kind}:v{VERSION}:{digest}"


def _part(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ",".join(_part(v) for v in value) + "]"
    return str(value)


def get_or_build(cache_key: str | None, build: Callable[[], T], run: Any = None) -> T:
    """The cached value for ``cache_key``, else ``build()`` (stored under the key). With
    ``cache_key`` None (something unfinished in it) it is always built. With ``run`` (a
    finished run whose own page this is) the value is also kept in Postgres and read
    from there when the cache has forgotten it (module docstring)."""
    if cache_key is None:
        return build()
    cache = caches[ALIAS]
    try:
        found = cache.get(cache_key)
    except Exception:  # a shared cache out of reach: the page is built, as if cold
        log.warning("pages cache unreadable; building the page", exc_info=True)
        return build()
    if found is not None:
        return found
    value = stored(cache_key) if run is not None else None
    if value is None:
        value = build()
        if run is not None:
            store(run, cache_key, value)
    try:
        cache.set(cache_key, value, TIMEOUT_SECONDS)
    except Exception:  # full (maxmemory), or out of reach: the reader still gets the page
        log.warning("pages cache unwritable; the page is served uncached", exc_info=True)
    return value


def stored(cache_key: str) -> Any:
    """The page kept in Postgres under ``cache_key``, or None (none, or unreadable)."""
    from portal.web.models import StoredPage

    try:
        blob = StoredPage.objects.filter(key=cache_key).values_list("value", flat=True).first()
        return None if blob is None else pickle.loads(zlib.decompress(blob))  # noqa: S301 - ours
    except Exception:  # a row of another code version, or the database refused: build it
        log.warning("stored page %s unreadable; building it", cache_key, exc_info=True)
        return None


def store(run: Any, cache_key: str, value: Any) -> None:
    """Keep ``value`` in Postgres under ``cache_key`` for the finished ``run``, and delete
    the run's rows that no key can name any more (an older ``updated_at`` or VERSION):
    one statement."""
    blob = zlib.compress(pickle.dumps(value, pickle.HIGHEST_PROTOCOL), 6)
    sql = (  # StoredPage's table
        "WITH stale AS (DELETE FROM web_storedpage WHERE run_id = %s"
        " AND NOT (version = %s AND created_at >= %s))"
        " INSERT INTO web_storedpage (run_id, key, version, value, created_at)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING"  # another process was first
    )
    params = [run.pk, VERSION, run.updated_at, run.pk, cache_key, VERSION, blob, timezone.now()]
    try:
        with transaction.atomic(), connection.cursor() as cursor:  # a failure leaves the
            cursor.execute(sql, params)  # request's transaction as it was
    except DatabaseError:  # a read-only replica, or the run just deleted: served unstored
        log.warning("could not store the page of run %s", run.pk, exc_info=True)


def all_final(runs: Iterable[Any]) -> bool:
    return all(run.is_final for run in runs)


def shared() -> bool:
    """Is the cache one that every web process reads (Redis), so warming it pays?"""
    return isinstance(caches[ALIAS], RedisCache)


class SharedPages(RedisCache):
    """Django's Redis cache for the pages, in the database Celery's broker uses: its
    ``clear`` deletes the pages' own keys (its KEY_PREFIX), never the whole database."""

    def clear(self) -> None:
        client = self._cache.get_client(None, write=True)
        batch: list[Any] = []
        for found in client.scan_iter(match=f"{self.key_prefix}:*", count=1000):
            batch.append(found)
            if len(batch) >= 1000:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
