"""HTML pages: runs list, submission form, run permalink, API tokens, sign-in.

Views read through ``portal.benchmarks.queries`` and write through
``portal.benchmarks.services``; no business rule lives here. Every page runs a fixed
number of queries whatever the number of runs or measurements.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Max
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from portal.accounts.models import ApiToken
from portal.accounts.tokens import create_user_token, revoke_token
from portal.benchmarks import queries, services
from portal.benchmarks.models import Measurement, Run
from portal.web import figures, presenters
from portal.web.forms import RunForm, TokenForm, preset_yaml
from runners import spec as rs

PAGE_SIZE = 25


def _run_or_404(request: HttpRequest, public_id: str) -> Run:
    try:
        return queries.get_visible_run(request.user, public_id)
    except Run.DoesNotExist:
        raise Http404("No such run, or it is private to its owner.") from None


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("web:run-list")
    recent = queries.run_list(request.user)[:10]
    return render(request, "web/home.html", {"recent": recent})


@require_GET
def run_list(request: HttpRequest) -> HttpResponse:
    try:
        filters = queries.RunFilters.from_params(request.GET)
        error = None
    except queries.FilterError as exc:
        filters, error = queries.RunFilters(), f"{exc.field}: {exc}"
    paginator = Paginator(queries.run_list(request.user, filters), PAGE_SIZE)
    page = paginator.get_page(request.GET.get("page"))
    runs = list(page.object_list)
    best = dict(
        Measurement.objects.filter(run__in=[r.pk for r in runs], status="succeeded")
        .values("run_id")
        .annotate(best=Max("output_throughput"))
        .values_list("run_id", "best")
    )
    for run in runs:
        run.best_output_throughput = best.get(run.pk)
    context = {
        "page": page,
        "runs": runs,
        "filters": filters,
        "filter_error": error,
        "choices": queries.filter_choices(request.user),
        "query": urlencode(filters.as_params()),
    }
    return render(request, "web/run_list.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def run_new(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = RunForm(request.POST)
        if form.is_valid() and form.spec is not None:
            run = services.create_run(
                request.user,
                form.spec,
                form.cleaned_data.get("name") or None,
                is_public=form.cleaned_data.get("is_public", False),
            )
            messages.success(request, f"Run {run.short_id} is queued.")
            return redirect(run.get_absolute_url())
    else:
        form = RunForm()
        chosen = request.GET.get("preset", "seed")
        form.initial_from_preset(chosen if chosen in rs.PRESETS else "seed")
    presets = {key: preset_yaml(key) for key in rs.PRESETS}
    # A form with errors is re-rendered with 200, as Django forms are; the errors sit at
    # their fields and nothing was stored.
    return render(request, "web/run_new.html", {"form": form, "presets": presets})


def _measurement_rows(run: Run) -> list[Measurement]:
    return list(queries.run_measurements(run))


@require_GET
def run_detail(request: HttpRequest, public_id: str) -> HttpResponse:
    run = _run_or_404(request, public_id)
    rows = _measurement_rows(run)
    environment = presenters.environment_of(run)
    chart_rows = [presenters.chart_row(m) for m in rows]
    context = {
        "run": run,
        "measurements": rows,
        "figures": figures.run_figures(chart_rows),
        "summary": presenters.summary(chart_rows),
        "environment": environment,
        "env_facts": presenters.environment_facts(environment.snapshot if environment else {}),
        "reproduce": presenters.reproduce_commands(run),
        "can_cancel": queries.can_cancel(request.user, run) and not run.is_final,
        "spec_yaml": rs.dump_spec(rs.parse_spec(run.spec)),
        "status_url": reverse("web:run-status", args=[run.public_id]),
        "absolute_url": request.build_absolute_uri(run.get_absolute_url()),
    }
    return render(request, "web/run_detail.html", context)


@require_GET
def run_status(request: HttpRequest, public_id: str) -> JsonResponse:
    """What the run page polls while the run is active (one cheap query)."""
    run = _run_or_404(request, public_id)
    return JsonResponse(
        {
            "status": run.status,
            "status_display": run.get_status_display(),
            "final": run.is_final,
            "done": run.progress_done,
            "total": run.progress_total,
            "failure_reason": run.failure_reason,
            "updated_at": run.updated_at.isoformat(),
        }
    )


@require_GET
def run_spec(request: HttpRequest, public_id: str) -> HttpResponse:
    run = _run_or_404(request, public_id)
    body = rs.dump_spec(rs.parse_spec(run.spec))
    response = HttpResponse(body, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="servebench-{run.short_id}-spec.yaml"'
    return response


@require_GET
def run_result(request: HttpRequest, public_id: str) -> HttpResponse:
    run = _run_or_404(request, public_id)
    body = json.dumps(services.result_document(run), indent=2)
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = (
        f'attachment; filename="servebench-{run.short_id}-result.json"'
    )
    return response


@login_required
@require_POST
def run_cancel(request: HttpRequest, public_id: str) -> HttpResponse:
    run = _run_or_404(request, public_id)
    if not queries.can_cancel(request.user, run):
        raise Http404("Only the run's owner can cancel it.")
    if services.cancel_run(run, by=request.user):
        messages.success(request, "The run is cancelled; its runner is being stopped.")
    else:
        messages.error(request, f"The run had already ended ({run.status}).")
    return redirect(run.get_absolute_url())


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    new_plaintext = None
    form = TokenForm()
    if request.method == "POST":
        if "revoke" in request.POST:
            token = ApiToken.objects.filter(
                pk=request.POST.get("revoke"), user=request.user, kind=ApiToken.Kind.CI
            ).first()
            if token is not None and revoke_token(token):
                messages.success(request, f"Token {token} is revoked.")
            return redirect("web:tokens")
        form = TokenForm(request.POST)
        if form.is_valid():
            issued = create_user_token(request.user, form.cleaned_data["name"])
            new_plaintext = issued.plaintext
            form = TokenForm()
    user_tokens = ApiToken.objects.filter(user=request.user, kind=ApiToken.Kind.CI)
    context: dict[str, Any] = {
        "form": form,
        "tokens": user_tokens,
        "new_plaintext": new_plaintext,
        "api_base": request.build_absolute_uri("/api/v1/"),
    }
    return render(request, "web/tokens.html", context)
