"""The compare page: /compare/?runs=a,b,c&baseline=a (a permalink).

The selection and the baseline live in the URL; a form post from the runs list
(repeated ``runs`` checkboxes) is redirected to that canonical form. Every run must be
visible to the reader, else 404 (as for a single run: ids do not leak).
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from portal.benchmarks import compare as cmp
from portal.benchmarks.models import Run
from portal.web import figures, tables
from portal.web.figures.common import color
from servebench import verdict as engine


def compare_url(ids: list[str], baseline: str) -> str:
    """The permalink: ``/compare/?runs=a,b,c&baseline=a`` (ids are [a-z0-9]: no quoting)."""
    return f"{reverse('web:compare')}?runs={','.join(ids)}&baseline={baseline}"


@require_GET
def compare_page(request: HttpRequest) -> HttpResponse:
    try:
        ids, baseline = cmp.parse_selection(
            request.GET.getlist("runs"), request.GET.get("baseline")
        )
    except cmp.SelectionError as exc:
        context = {"error": f"{exc.field}: {exc}"}
        return render(request, "web/compare.html", context, status=400)
    canonical = compare_url(ids, baseline)
    given = (request.GET.getlist("runs"), request.GET.get("baseline"), len(request.GET))
    if given != ([",".join(ids)], baseline, 2):
        return redirect(canonical)
    try:
        comparison = cmp.compare(request.user, ids, baseline)
    except Run.DoesNotExist:
        raise Http404("One of these runs does not exist or is private to its owner.") from None
    metrics = list({r.metric.key: r.metric for r in comparison.rows}.values())
    output, ttft = comparison.headline(), comparison.headline("p99_ttft_ms")
    headline = [
        {
            "column": column,
            "colour": color(i),
            "is_baseline": i == comparison.baseline,
            "output": output[i],
            "ttft": ttft[i],
            "counts": comparison.counts(i),
            "baseline_url": compare_url(ids, column.run.public_id),
        }
        for i, column in enumerate(comparison.columns)
    ]
    context = {
        "comparison": comparison,
        "not_comparable": [h for h in headline if not h["column"].comparable],
        "threshold": engine.DEFAULT_THRESHOLD,
        "min_history": engine.MIN_HISTORY,
        "columns": comparison.columns,
        "figures": figures.compare_figures(comparison),
        "metrics": metrics,
        "headline": headline,
        "tbody": tables.compare_tbody(tables.compare_lines(comparison.rows)),
        "permalink": request.build_absolute_uri(canonical),
        "api_url": reverse("api:compare")
        + "?"
        + urlencode({"runs": ",".join(ids), "baseline": baseline}),
    }
    return render(request, "web/compare.html", context)
