"""Pages built when a run ends, so that even their first reader is served warm.

The runner's "finished" report builds, where every web process reads them (Postgres,
``pagecache.store``, and the pages cache):

- the ended run's page, as its managers and as everyone else see it (``run_page.warm``);
- the history the page links to, as its owner and, for a public run, a visitor see it
  (``views.history.warm``): the series changed, so its old history is stale;
- the compare its "Compare with the original / its re-runs" link opens, and its
  original's (which now lists this re-run), as the owner sees them: ~2,800 verdicts for
  8 runs x 20 points, paid here once rather than by the reader.
"""

from __future__ import annotations

import logging
from typing import Any

from portal.benchmarks import reproduce
from portal.benchmarks.models import Run
from portal.web import run_page
from portal.web.views import compare, history

log = logging.getLogger(__name__)


def ended(run_id: int) -> list[str]:
    """Build the ended run's pages (module docstring); what was built ("run",
    "history", "compare" per compare). Never raises: a failure costs the first reader a
    cold page, never the runner its report."""
    built: list[str] = []
    try:
        run = Run.objects.select_related("owner").filter(pk=run_id).first()
        if run is None or not run.is_final:
            return built
        point = run_page.warm(run).get("history_point")
        built.append("run")
        if (
            run.fingerprint
            and point is not None
            and history.warm(run, point.point_key, point.backend)
        ):
            built.append("history")
        built += _compares(run)
    except Exception:
        log.warning("could not build the pages of run %s", run_id, exc_info=True)
    return built


def _compares(run: Run) -> list[str]:
    """Build the compares the pages of ``run`` and of its original link to, as the owner
    sees them (finished runs only: an unfinished one is not kept)."""
    built: list[str] = []
    original = reproduce.original_of(run.owner, run)
    originals = {run: original}  # each page's run -> its original (None: not a re-run)
    if original is not None:
        originals[original] = reproduce.original_of(run.owner, original)
    for page_run, its_original in originals.items():
        # What the page's link reads (not run_page.rerun_context: its reproduction
        # verdict is a comparison of its own, not needed here).
        page_info: dict[str, Any] = {"reruns": reproduce.reruns_of(run.owner, page_run)}
        if its_original is not None:
            page_info["original"] = its_original
        ordered, reference = run_page.related_compare(page_run, page_info)
        if len(ordered) > 1 and all(r.is_final for r in ordered):
            compare.cached_part(run.owner, ordered, reference)
            built.append("compare")
    return built
