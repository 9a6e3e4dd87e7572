"""The history page: /history/<fingerprint>/?metric=output_throughput&point=<key>.

When every run of the series the reader sees is finished, the rendered history is
kept (``portal.web.pagecache``: the cache, then Postgres), keyed by the series' stamp:
how many of its runs the reader sees and the latest ``updated_at`` among them (a new
run, a finished one or a sharing change makes a new key). Only the rendered HTML is
kept (a ``History`` of 1,000 runs is slow to unpickle); the context's ``history`` and
``figures`` are there when this request computed them.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, Max, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from portal.benchmarks import history as hist
from portal.benchmarks import queries
from portal.benchmarks.models import FINAL_STATUSES, Run
from portal.benchmarks.points import METRIC_BY_KEY
from portal.web import figures, pagecache, run_rows
from portal.web.figures.common import by_sweep, chart

TABLE_ROWS = 100  # the chart shows every run; the table the newest ones


def _stamp(user: AbstractBaseUser | AnonymousUser, fingerprint: str) -> tuple[int, Any, int, Any]:
    """(runs the reader sees in the series, their latest updated_at, how many of them are
    still active, the newest one's id): one indexed aggregate."""
    found = (
        queries.visible_runs(user)
        .filter(fingerprint=fingerprint)
        .aggregate(
            n=Count("id"),
            last=Max("updated_at"),
            active=Count("id", filter=~Q(status__in=FINAL_STATUSES)),
            newest=Max("id"),
        )
    )
    return found["n"], found["last"], found["active"], found["newest"]


def cache_slot(
    user: AbstractBaseUser | AnonymousUser,
    fingerprint: str,
    metric: str,
    point: str | None,
    backend: str | None,
    kind: str = "history",
) -> pagecache.Slot | None:
    """Where the history is kept for this reader (``kind``: the web page's rendered part,
    or the API's answer; stamped with the series' stamp, gone with its newest run), None
    while a run of the series it sees is in flight (not kept then); Http404 when it sees
    none."""
    count, last, active, newest = _stamp(user, fingerprint)
    if not count:
        raise Http404("No run with this fingerprint that you can see.")
    if active:
        return None
    who = user.pk if user.is_authenticated else "anon"
    identity = (who, fingerprint, metric, point, backend)
    return pagecache.slot(kind, identity, (count, last), newest)


def _part(
    user: AbstractBaseUser | AnonymousUser,
    fingerprint: str,
    metric: str,
    point: str | None,
    backend: str | None,
    fresh: dict[str, Any],
    where: pagecache.Slot | None,
) -> dict[str, Any]:
    """The rendered history body, kept in ``where`` (``cache_slot``); ``fresh``
    gets the objects behind it when built here. Raises Http404 (no run the reader sees),
    hist.HistoryError (a bad parameter)."""

    def build() -> dict[str, Any]:
        fresh["history"] = hist.history(user, fingerprint, metric, point, backend)
        fresh["figures"] = [
            chart("history", "", "history", figures.history_figure(fresh["history"]))
        ]
        return {
            "body": render_to_string("web/_history_body.html", history_context(fresh, fingerprint))
        }

    try:
        return pagecache.get_or_build(where, build)
    except Run.DoesNotExist:
        raise Http404("No run with this fingerprint that you can see.") from None


def warm(run: Run, point: str, backend: str) -> bool:
    """Build the history the finished ``run``'s page links to (its series, output tok/s
    at ``point`` on ``backend``) where pages are kept, as its owner and, for a public
    run, as a visitor sees it; False when the series still has a run in flight (its
    history is not kept then)."""
    readers: list[AbstractBaseUser | AnonymousUser] = [run.owner]
    if run.is_public:
        readers.append(AnonymousUser())
    for reader in readers:
        where = cache_slot(reader, run.fingerprint, "output_throughput", point, backend)
        if where is None:
            return False
        _part(reader, run.fingerprint, "output_throughput", point, backend, {}, where)
    return True


@require_GET
def history_page(request: HttpRequest, fingerprint: str) -> HttpResponse:
    metric = request.GET.get("metric") or "output_throughput"
    point = request.GET.get("point") or None
    backend = request.GET.get("backend") or None
    if not hist.FINGERPRINT_RE.match(fingerprint or ""):
        raise Http404("No run with this fingerprint that you can see.")
    fresh: dict[str, Any] = {}  # the objects behind the page, when this request built it
    try:
        where = cache_slot(request.user, fingerprint, metric, point, backend)
        part = _part(request.user, fingerprint, metric, point, backend, fresh, where)
    except hist.HistoryError as exc:
        context = {"error": f"{exc.field}: {exc}", "fingerprint": fingerprint}
        return render(request, "web/history.html", context, status=400)
    context = {**part, "fingerprint": fingerprint, **fresh}
    return render(request, "web/history.html", context)


def history_context(fresh: dict[str, Any], fingerprint: str) -> dict[str, Any]:
    """What ``_history_body.html`` shows: the series, its chart, the newest runs."""
    history = fresh["history"]
    return {
        "history": history,
        "figures": fresh["figures"],
        "chart_groups": by_sweep(fresh["figures"]),
        "metric_choices": [METRIC_BY_KEY[k] for k in hist.HISTORY_METRICS],
        "fingerprint": fingerprint,
        "tbody": run_rows.history_rows(list(reversed(history.points))[:TABLE_ROWS]),
        "table_rows": TABLE_ROWS,
    }
