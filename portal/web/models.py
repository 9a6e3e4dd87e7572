"""What the pages keep in Postgres: a finished run's page, built once (``StoredPage``)."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class StoredPage(models.Model):
    """A finished run's page part (``portal.web.run_page.results_part``), pickled and
    compressed under its pages-cache key: the tier of ``portal.web.pagecache`` that
    outlives the cache (a day's timeout, a restart, an eviction, a per-process cache that
    another process filled). Written when the run ends (``portal.web.warm``) or by its
    first reader; the key carries the run's ``updated_at`` and ``pagecache.VERSION``, so
    a stale row is never read, and writing a run's page deletes its stale rows."""

    run = models.ForeignKey("benchmarks.Run", on_delete=models.CASCADE, related_name="+")
    # The pages-cache key (pagecache.key); its unique index serves the read by key.
    key = models.CharField(max_length=100, unique=True)
    version = models.PositiveSmallIntegerField(help_text="pagecache.VERSION when stored.")
    value = models.BinaryField(help_text="zlib(pickle(the page part)).")
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.key} (run {self.run_id})"
