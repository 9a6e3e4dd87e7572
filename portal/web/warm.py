"""Pages built when a run ends, so that even their first reader is served warm.

The runner's "finished" report builds the ended run's page (as its managers and as
everyone else see it: ``run_page.warm``), kept in Postgres (``pagecache.store``) where
every web process reads it. Where the pages cache is shared by every web process
(``SERVEBENCH_PAGE_CACHE=redis``, ``pagecache.shared``), it also builds the history the
page links to (as its owner and, for a public run, a visitor see it:
``views.history.warm``); with a per-process cache only the process that took the report
would gain from that, so it is not built.
"""

from __future__ import annotations

import logging

from portal.benchmarks.models import Run
from portal.web import pagecache, run_page
from portal.web.views import history

log = logging.getLogger(__name__)


def ended(run_id: int) -> list[str]:
    """Build the ended run's pages (module docstring); what was built ("run",
    "history"). Never raises: a failure costs the first reader a cold page, never the
    runner its report."""
    built: list[str] = []
    try:
        run = Run.objects.select_related("owner").filter(pk=run_id).first()
        if run is None or not run.is_final:
            return built
        point = run_page.warm(run).get("history_point")
        built.append("run")
        if (
            pagecache.shared()
            and run.fingerprint
            and point is not None
            and history.warm(run, point.point_key, point.backend)
        ):
            built.append("history")
    except Exception:
        log.warning("could not build the pages of run %s", run_id, exc_info=True)
    return built
