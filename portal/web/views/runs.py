"""Run pages: the list (with compare checkboxes), the form, the permalink and its
downloads, cancel, re-run, sharing and the runner's log.

Views read through ``portal.benchmarks`` (queries, points, compare...) and write through
its services; no business rule lives here. Every page runs a fixed number of queries
whatever the number of runs or measurements.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from portal.accounts import quotas
from portal.benchmarks import (
    baselines,
    documents,
    intake,
    lifecycle,
    presets,
    queries,
    reproduce,
    runview,
    sharing,
)
from portal.benchmarks.models import PUBLIC_ID_LENGTH, Run
from portal.benchmarks.queue import queue_info
from portal.web import run_notes, run_page, tables
from portal.web.forms import RunForm, preset_yaml
from runners import spec as rs

PAGE_SIZE = 25
# Counting every run a reader sees grows with the table (an index-only scan of each
# visible run: ~5 ms at 34,000); the list counts up to this many and says "more than".
COUNT_CAP = 1_000


class RunPage:
    """One page of the runs list (``number`` from 1): its runs (with their best output
    tok/s, the column ingestion keeps), and how many match, exact
    up to ``COUNT_CAP`` (``more``: there are more; no last page then). A page past the
    end is the last one, as Django's ``Paginator.get_page`` does."""

    def __init__(self, runs: QuerySet[Run], number: str | None) -> None:
        size = PAGE_SIZE
        self.count = runs.order_by().values("pk")[: COUNT_CAP + 1].count()
        self.more = self.count > COUNT_CAP
        self.count = min(self.count, COUNT_CAP)
        self.num_pages = None if self.more else max(1, -(-self.count // size))
        try:
            wanted = max(1, int(number or 1))
        except ValueError:
            wanted = 1
        self.number = wanted if self.num_pages is None else min(wanted, self.num_pages)
        start = (self.number - 1) * size
        page = runs[start : start + size + 1]
        found = list(page)  # one more than the page: is there a next page?
        self.object_list = found[:size]
        self.has_next = len(found) > size
        self.has_previous = self.number > 1
        self.next_page_number = self.number + 1
        self.previous_page_number = self.number - 1
        self.has_other_pages = self.has_next or self.has_previous

    @property
    def label(self) -> str:
        """ "1 run", "2,345 runs", "More than 10,000 runs"."""
        if self.more:
            return f"More than {self.count:,} runs"
        return f"{self.count:,} run{'' if self.count == 1 else 's'}"


class RunNotFound(Http404):
    """A 404 about a run id: the error page (``404.html``) shows its message, and the runs
    an ambiguous id prefix starts (all of them readable by the visitor)."""

    def __init__(self, message: str, matches: list[Run] | None = None):
        super().__init__(message)
        self.message = message
        self.matches = matches or []


def run_or_404(request: HttpRequest, public_id: str) -> Run:
    """The run ``public_id`` names (its id, or a unique prefix such as the short id) if
    the visitor may read it (``queries.run_access``); RunNotFound otherwise, the same for
    a run that does not exist and one the visitor may not see."""
    try:
        return queries.get_visible_run(request.user, public_id)
    except queries.AmbiguousRunId as exc:
        raise RunNotFound(str(exc), exc.matches) from None
    except Run.DoesNotExist as exc:
        if len(public_id) < PUBLIC_ID_LENGTH and exc.args:
            raise RunNotFound(f"{exc.args[0][:1].upper()}{exc.args[0][1:]}.") from None
        raise RunNotFound("No such run, or it is private to its owner.") from None


def permalink(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A GET of a run page by an id prefix (``/runs/<short id>/...``) redirects to the same
    page under the run's full id, its permalink; other methods act on the run it names."""

    @functools.wraps(view)
    def wrapper(request: HttpRequest, public_id: str, *args: Any, **kwargs: Any) -> HttpResponse:
        if len(public_id) != PUBLIC_ID_LENGTH and request.method in ("GET", "HEAD"):
            run = run_or_404(request, public_id)
            match = request.resolver_match
            url = reverse(match.view_name if match else "web:run-detail", args=[run.public_id])
            query = request.META.get("QUERY_STRING", "")
            return redirect(f"{url}?{query}" if query else url)
        return view(request, public_id, *args, **kwargs)

    return wrapper


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
    page = RunPage(queries.run_list(request.user, filters), request.GET.get("page"))
    runs = page.object_list
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
    """The form (``portal.web.forms.RunForm``: the spec text is what runs); a submit
    refused by fair use is answered with the API's status (409 or 403) and its reason."""
    refused: quotas.QuotaExceeded | None = None
    if request.method == "POST":
        form = RunForm(request.POST, user=request.user)
        if form.is_valid() and form.spec is not None:
            try:
                run = intake.create_run(
                    request.user, form.spec, None, is_public=form.cleaned_data.get("is_public")
                )
            except rs.SpecError as exc:  # the form checks the same rules first
                for err in exc.errors:
                    form._spec_problem(err)
            except quotas.QuotaExceeded as exc:  # fair use: the same refusal as the API's
                refused = exc
            else:
                messages.success(request, f"Run {run.short_id} is queued.")
                for warning in form.warnings:
                    messages.warning(request, f"{warning['path']}: {warning['message']}")
                return redirect(run.get_absolute_url())
        # Re-rendered with 200, as Django forms are: every problem at its field, the spec
        # text as it would have run, the fields read back from it; nothing was stored.
        form.rebind_shown()
    else:
        form = RunForm(user=request.user)
        chosen = request.GET.get("preset", "")
        source = _run_to_edit(request)
        if source is not None:  # "Edit and submit again" on a run that measured nothing
            form.initial_from_text(rs.dump_spec(rs.parse_spec(source.spec, stored=True)))
        else:
            form.initial_from_preset(
                chosen if chosen in presets.available() else presets.default_name()
            )
    state = form.state() if form.is_bound else None
    # Each preset's spec text, so choosing one fills the spec at once (then checked).
    texts = {name: preset_yaml(name) for name in presets.available()}
    context = {
        "form": form,
        "state": state,
        "presets": texts,
        "quota": quotas.summary(request.user),
        "refused": refused,
    }
    return render(request, "web/run_new.html", context, status=refused.status if refused else 200)


def _run_to_edit(request: HttpRequest) -> Run | None:
    """The run named by ``?from=`` when this user may see it and its spec still reads."""
    public_id = request.GET.get("from", "")
    if not public_id:
        return None
    run = queries.visible_runs(request.user).filter(public_id=public_id[:64]).first()
    if run is None:
        return None
    try:
        rs.parse_spec(run.spec, stored=True)
    except rs.SpecError:
        return None
    return run


@login_required
@require_POST
def run_new_check(request: HttpRequest) -> JsonResponse:
    """The form's live check: the same form as a submit, nothing stored. The page's script
    posts the form on every edit and shows what comes back (``RunForm.state``)."""
    form = RunForm(request.POST, user=request.user)
    form.is_valid()
    response = JsonResponse(form.state())
    response["Cache-Control"] = "no-store"
    return response


@require_GET
@permalink
def run_detail(request: HttpRequest, public_id: str) -> HttpResponse:
    run = run_or_404(request, public_id)
    context = run_page.build(request.user, run, request.GET.get("reference"))
    point = context["history_point"]
    if run.fingerprint and point is not None:
        query = urlencode(
            {"metric": "output_throughput", "point": point.point_key, "backend": point.backend}
        )
        context["history_url"] = reverse("web:history", args=[run.fingerprint]) + "?" + query
    context.update(
        run=run,
        run_notes=run_notes.notes(request.user, run),
        storage_notice=sharing.storage_notice(request.user, run),
        status_url=reverse("web:run-status", args=[run.public_id]),
        log_url=reverse("web:run-log", args=[run.public_id]),
        absolute_url=request.build_absolute_uri(run.get_absolute_url()),
    )
    return render(request, "web/run_detail.html", context)


@require_GET
@permalink
def run_status(request: HttpRequest, public_id: str) -> JsonResponse:
    """What the run page polls while the run is active (one cheap query; two more while
    it waits in the queue)."""
    run = run_or_404(request, public_id)
    return JsonResponse(
        {
            "status": run.status,
            "status_display": run.get_status_display(),
            "final": run.is_final,
            "done": run.progress_done,
            "total": run.progress_total,
            "failure_reason": sharing.failure_reason_for(request.user, run),
            "queue": queue_info(run),
            "storage_problem": sharing.storage_notice(request.user, run),
            "updated_at": run.updated_at.isoformat(),
        }
    )


@require_GET
@permalink
def run_log(request: HttpRequest, public_id: str) -> HttpResponse:
    """The runner's log tail as text (owner and staff; 404 for everyone else)."""
    run = run_or_404(request, public_id)
    if not queries.may_manage(request.user, run):
        raise Http404("Only the run's owner can read its runner's log.")
    tail = run_page.log_tail(request.user, run)
    body = "" if tail is None else (tail.error or tail.text or tail.note)
    response = HttpResponse(body, content_type="text/plain; charset=utf-8")
    response["Cache-Control"] = "no-store"
    return response


@require_GET
@permalink
def run_spec(request: HttpRequest, public_id: str) -> HttpResponse:
    run = run_or_404(request, public_id)
    body = rs.dump_spec(rs.parse_spec(run.spec, stored=True))
    response = HttpResponse(body, content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="servebench-{run.short_id}-spec.yaml"'
    return response


@require_GET
@permalink
def run_result(request: HttpRequest, public_id: str) -> HttpResponse:
    run = run_or_404(request, public_id)
    document = sharing.document_for(request.user, run, documents.result_document(run))
    body = json.dumps(document, indent=2)
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = (
        f'attachment; filename="servebench-{run.short_id}-result.json"'
    )
    return response


def _results(request: HttpRequest, run: Run) -> Any:
    """The run's points, their speedups over the reader's ``?reference=`` (as the page)."""
    results = runview.load(run).results
    results.chosen_reference = run_page.reference_param(run, request.GET.get("reference"))
    return results


@require_GET
@permalink
def run_points_csv(request: HttpRequest, public_id: str) -> HttpResponse:
    """The summary table: one row per backend and point, each metric's mean and std."""
    run = run_or_404(request, public_id)
    response = HttpResponse(
        tables.as_csv(_results(request, run)), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="servebench-{run.short_id}-points.csv"'
    return response


@require_GET
@permalink
def run_points_json(request: HttpRequest, public_id: str) -> HttpResponse:
    run = run_or_404(request, public_id)
    body = {"run": run.public_id, "points": tables.records(_results(request, run))}
    response = JsonResponse(body, json_dumps_params={"indent": 2})
    response["Content-Disposition"] = (
        f'attachment; filename="servebench-{run.short_id}-points.json"'
    )
    return response


@login_required
@require_POST
def run_cancel(request: HttpRequest, public_id: str) -> HttpResponse:
    run = run_or_404(request, public_id)
    if not queries.may_manage(request.user, run):
        raise Http404("Only the run's owner can cancel it.")
    if lifecycle.cancel_run(run, by=request.user):
        messages.success(request, "The run is cancelled; its runner is being stopped.")
    else:
        run.refresh_from_db(fields=["status"])
        messages.error(request, f"The run had already ended ({run.status}).")
    return redirect(run.get_absolute_url())


@login_required
@require_POST
def run_rerun(request: HttpRequest, public_id: str) -> HttpResponse:
    """Submit the same spec again; the new run's page says whether it reproduced."""
    run = run_or_404(request, public_id)
    try:
        new = reproduce.rerun(run, request.user)
    except PermissionError:
        raise Http404("Only the run's owner can re-run it.") from None
    except rs.SpecError as exc:
        # Accepted once, refused now: a rule or the deployment's policy tightened since.
        messages.error(
            request,
            f"This run's spec is not accepted any more, so it cannot be re-run as it is: "
            f"{exc}. Copy the spec (Reproduce, below) into New run, change what is named, "
            "and submit it.",
        )
        return redirect(run.get_absolute_url())
    messages.success(request, f"Re-run {new.short_id} of {run.short_id} is queued.")
    return redirect(new.get_absolute_url())


@login_required
@require_POST
def run_visibility(request: HttpRequest, public_id: str) -> HttpResponse:
    """Make the run public (readable by anyone with the link) or private."""
    run = run_or_404(request, public_id)
    public = request.POST.get("is_public") in ("1", "true", "on")
    try:
        sharing.set_public(run, request.user, public)
    except PermissionError:
        raise Http404("Only the run's owner can change who sees it.") from None
    if public:
        messages.success(request, "The run is public: anyone with the link can read it.")
    else:
        messages.success(request, "The run is private: only you (and staff) can read it.")
    return redirect(run.get_absolute_url())


@login_required
@require_POST
def run_labels(request: HttpRequest, public_id: str) -> HttpResponse:
    """Add (``label``) or remove (``remove``) one of the run's labels (the owner: the
    rules and their messages are ``baselines.mark`` / ``unmark``'s)."""
    run = run_or_404(request, public_id)
    removing = "remove" in request.POST
    label = request.POST.get("remove" if removing else "label", "")
    try:
        if removing:
            baselines.unmark(run, request.user, label)
            messages.success(request, f"Label {label!r} removed.")
        else:
            _, created = baselines.mark(run, request.user, label)
            text = f"Labelled {label.strip()!r}" if created else f"Already labelled {label!r}"
            messages.success(
                request,
                f"{text}: latest:{label.strip()} is the newest succeeded run so labelled that "
                "measured this workload on this hardware.",
            )
    except PermissionError:
        raise Http404("Only the run's owner can label it.") from None
    except baselines.BaselineError as exc:
        messages.error(request, f"label: {exc.message}")
    return redirect(run.get_absolute_url())
