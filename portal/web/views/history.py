"""The history page: /history/<fingerprint>/?metric=output_throughput&point=<key>."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal.benchmarks import history as hist
from portal.benchmarks.models import Run
from portal.benchmarks.points import METRIC_BY_KEY
from portal.web import figures

TABLE_ROWS = 100  # the chart shows every run; the table the newest ones


@require_GET
def history_page(request: HttpRequest, fingerprint: str) -> HttpResponse:
    metric = request.GET.get("metric") or "output_throughput"
    point = request.GET.get("point") or None
    backend = request.GET.get("backend") or None
    try:
        history = hist.history(request.user, fingerprint, metric, point, backend)
    except Run.DoesNotExist:
        raise Http404("No run with this fingerprint that you can see.") from None
    except hist.HistoryError as exc:
        context = {"error": f"{exc.field}: {exc}", "fingerprint": fingerprint}
        return render(request, "web/history.html", context, status=400)
    context = {
        "history": history,
        "figures": [{"id": "history", "figure": figures.history_figure(history)}],
        "metric_choices": [METRIC_BY_KEY[k] for k in hist.HISTORY_METRICS],
        "fingerprint": fingerprint,
        "rows": list(reversed(history.points))[:TABLE_ROWS],
        "table_rows": TABLE_ROWS,
    }
    return render(request, "web/history.html", context)
