"""What the results pages compute from finished runs, computed once.

A finished run cannot change: no measurement, event or environment is accepted after
it ends. So the run page's rendered sections of a finished run (``run_page.KEPT``),
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

Every finished page is also kept in Postgres (``StoredPage``, a ``Slot`` below): the
cache forgets (a day's timeout, a restart, an eviction, or another process's memory),
and rebuilding costs far more than serving: a run's page ~3x, a compare of 8 runs x 20
points (~2,800 verdicts) 40-70x, a history of 1,000 runs ~30x. So a page is built once,
when its run ends (``portal.web.warm``: the run's page, the history and the compare it
links to) or for its first reader, and read back from the table after the cache has
forgotten it (one indexed query). A slot's ``subject`` names the page without its
stamps (kind, reader, selection): storing a newer page of a subject deletes the older.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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
    return f"sb:{kind}:v{VERSION}:{_digest(parts)}"


def _digest(parts: tuple[Any, ...]) -> str:
    text = "|".join(_part(p) for p in parts)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Slot:
    """Where a finished page lives: ``key`` in the pages cache and in Postgres; ``subject``
    the page without its stamps (storing a newer page of it deletes the older row);
    ``run_id`` the run the row is deleted with."""

    key: str
    subject: str
    run_id: int


def slot(kind: str, identity: tuple[Any, ...], stamps: tuple[Any, ...], run_id: int) -> Slot:
    """The slot of the page ``kind`` of ``identity`` (reader, selection, options) as of
    ``stamps`` (what its value depends on that can change: ``updated_at``, series
    stamps), kept with the run ``run_id``."""
    return Slot(key(kind, *identity, *stamps), f"sb:{kind}:{_digest(identity)}", run_id)


def _part(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ",".join(_part(v) for v in value) + "]"
    return str(value)


def get_or_build(where: Slot | None, build: Callable[[], T]) -> T:
    """The page in ``where``: from the pages cache, else from Postgres (then put back in
    the cache), else ``build()`` (stored in both). With ``where`` None (something
    unfinished in it) it is always built and kept nowhere."""
    if where is None:
        return build()
    cache = caches[ALIAS]
    try:
        found = cache.get(where.key)
    except Exception:  # a shared cache out of reach: the page is built, as if cold
        log.warning("pages cache unreadable; building the page", exc_info=True)
        return build()
    if found is not None:
        return found
    value = stored(where.key)
    if value is None:
        value = build()
        store(where, value)
    try:
        cache.set(where.key, value, TIMEOUT_SECONDS)
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


def store(where: Slot, value: Any) -> None:
    """Keep ``value`` in Postgres in ``where``, and delete the rows of the same subject
    that no key names any more (older stamps, another VERSION): one statement."""
    # Level 1: a compare answer of 8 runs x 20 points (640 kB) compresses in ~2 ms to 66 kB,
    # where level 6 took ~9 ms for 51 kB; it is paid on the request that builds the page.
    blob = zlib.compress(pickle.dumps(value, pickle.HIGHEST_PROTOCOL), 1)
    sql = (  # StoredPage's table
        "WITH stale AS (DELETE FROM web_storedpage WHERE subject = %s AND key <> %s)"
        " INSERT INTO web_storedpage (run_id, key, subject, version, value, created_at)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (key) DO NOTHING"  # another was first
    )
    params = [
        where.subject, where.key,
        where.run_id, where.key, where.subject, VERSION, blob, timezone.now(),
    ]  # fmt: skip
    try:
        with transaction.atomic(), connection.cursor() as cursor:  # a failure leaves the
            cursor.execute(sql, params)  # request's transaction as it was
    except DatabaseError:  # a read-only replica, or the run just deleted: served unstored
        log.warning("could not store the page %s", where.subject, exc_info=True)


def prune(computed_before: datetime) -> int:
    """Delete the kept compare and history pages computed before ``computed_before`` (a
    selection nobody reads any more should not stay forever; a run's own page goes with
    the run); how many."""
    from portal.web.models import StoredPage

    stale = StoredPage.objects.filter(created_at__lt=computed_before).exclude(
        subject__startswith="sb:run:"
    )
    return stale.delete()[0]


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
