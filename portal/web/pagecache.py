"""What the results pages compute from finished runs, computed once.

A finished run cannot change: no measurement, event or environment is accepted after
it ends. So the run page's figures, tables and rendered fragments of a finished run,
the compare page of finished runs and the history of a series are kept in the
``pages`` cache (settings: a per-process memory cache, bounded) and reused.

Every key carries the stamps of what the value depends on, so there is nothing to
delete by hand: a run's ``updated_at``, which each write that can still touch a finished
run moves (sharing toggles, status changes: ``sharing.set_public``,
``services.transition``); for compare and history, a stamp of the series the verdict
reads its noise from (how many runs the reader sees in it, and the latest
``updated_at`` among them). ``VERSION`` changes when what is cached changes shape.
Unfinished runs are never cached: their pages are rebuilt on every request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any, TypeVar

from django.core.cache import caches

ALIAS = "pages"
VERSION = 1
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


def get_or_build(cache_key: str | None, build: Callable[[], T]) -> T:
    """The cached value for ``cache_key``, else ``build()`` (stored under the key). With
    ``cache_key`` None (something unfinished in it) it is always built."""
    if cache_key is None:
        return build()
    cache = caches[ALIAS]
    found = cache.get(cache_key)
    if found is not None:
        return found
    value = build()
    cache.set(cache_key, value, TIMEOUT_SECONDS)
    return value


def all_final(runs: Iterable[Any]) -> bool:
    return all(run.is_final for run in runs)
