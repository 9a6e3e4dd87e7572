"""What the pages keep in Postgres: finished pages, built once (``StoredPage``)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class StoredPage(models.Model):
    """A finished page part (a run's page, a compare, a history: web and API), pickled and
    compressed under its pages-cache key: the tier of ``portal.web.pagecache`` that
    outlives the cache (a day's timeout, a restart, an eviction, a per-process cache that
    another process filled). Written when its run ends (``portal.web.warm``) or by its
    first reader; the key carries the stamps of what the page depends on and
    ``pagecache.VERSION``, so a stale row is never read, and writing a page deletes the
    older rows of its subject."""

    # Deleted with the page's run (a compare's reference run, a history's newest run).
    run = models.ForeignKey("benchmarks.Run", on_delete=models.CASCADE, related_name="+")
    # The pages-cache key (pagecache.key); its unique index serves the read by key.
    key = models.CharField(max_length=100, unique=True)
    # The page without its stamps (pagecache.Slot): the rows a newer page replaces.
    subject = models.CharField(max_length=100, db_index=True)
    version = models.PositiveSmallIntegerField(help_text="pagecache.VERSION when stored.")
    value = models.BinaryField(help_text="zlib(pickle(the page part)).")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.key} (run {self.run_id})"
