"""The compare page: /compare/?runs=a,b,c&reference=a (a permalink).

The selection and the reference run live in the URL; a form post from the runs list
(repeated ``runs`` checkboxes), a URL without a reference, one naming it ``baseline=``
(the word older links used), or one naming runs by a unique prefix of their ids (the
short ids the pages show) is redirected to that canonical form. Without a reference, the
oldest of the chosen runs is the reference (what a change is measured from); the page
has a selector to pick another. ("Baseline" is kept for the HF baselines; the label a CI
pipeline marks runs with is a "label".) Every run must be visible to
the reader, else 404 (as for a single run: ids do not leak). No run, or one, chosen: a
page that says what to do instead of an empty comparison.

Everything the page shows comes from ``portal.benchmarks.compare`` (the verdict engine's
words; only what it calls worse or better is coloured). When every run is finished the
rendered comparison is kept (``portal.web.pagecache``: the cache, then Postgres), keyed by
each run's ``updated_at`` and the stamp of the baseline's series (the runs its noise
history reads); a run that ends builds the compare its page links to (``portal.web.warm``).
The context's ``comparison`` and ``figures`` are there when this request computed them
(None when the page came from the cache).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, Max
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET

from portal.benchmarks import compare as cmp
from portal.benchmarks import queries
from portal.benchmarks.models import PUBLIC_ID_LENGTH, Run
from portal.web import figures, pagecache, tables
from portal.web.figures.common import by_sweep, color
from servebench import verdict as engine


def compare_url(ids: list[str], reference: str) -> str:
    """The permalink: ``/compare/?runs=a,b,c&reference=a`` (ids are [a-z0-9]: no quoting)."""
    return f"{reverse('web:compare')}?runs={','.join(ids)}&reference={reference}"


def _reference_param(request: HttpRequest) -> str | None:
    """The reference run the URL names: ``reference``, or ``baseline`` in older links."""
    return request.GET.get("reference") or request.GET.get("baseline")


def _not_found() -> Http404:
    return Http404("One of these runs does not exist or is private to its owner.")


def _full_ids(user: AbstractBaseUser | AnonymousUser, ids: list[str]) -> list[str]:
    """Each id as the run's full id: a unique prefix (the short id) resolves to its run
    among those ``user`` may read; 404 for one that names none or several."""
    out = []
    for public_id in ids:
        if len(public_id) >= PUBLIC_ID_LENGTH:
            out.append(public_id)
            continue
        try:
            out.append(queries.get_visible_run(user, public_id).public_id)
        except Run.DoesNotExist:
            raise _not_found() from None
    return list(dict.fromkeys(out))


def _series_stamp(user: AbstractBaseUser | AnonymousUser, base: Run) -> tuple[int, Any]:
    """How many runs of the baseline's series ``user`` sees, and the latest change among
    them: the verdict's noise history reads them, so a new one changes the page."""
    if not base.fingerprint:
        return 0, None
    found = (
        queries.visible_runs(user)
        .filter(fingerprint=base.fingerprint, owner_id=base.owner_id)
        .aggregate(n=Count("id"), last=Max("updated_at"))
    )
    return found["n"], found["last"]


# What the compare views read of the chosen runs before the comparison is built: the
# permalink, the cache slot (cache_slot) and the one-run page. The runs' specs and
# timings stay unread: a kept page is served without decoding 8 runs' JSON (~0.8 ms);
# the comparison reads the runs whole when it is built (compare.compare).
SELECTED_FIELDS = (
    "public_id",
    "name",
    "owner",
    "status",
    "created_at",
    "updated_at",
    "fingerprint",
    "is_public",
)


def selected_runs(user: AbstractBaseUser | AnonymousUser, ids: list[str]) -> dict[str, Run]:
    """The runs among ``ids`` that ``user`` may see, by id (``SELECTED_FIELDS`` read)."""
    chosen = queries.visible_runs(user).filter(public_id__in=ids).only(*SELECTED_FIELDS)
    return {r.public_id: r for r in chosen}


def cache_slot(
    kind: str, user: AbstractBaseUser | AnonymousUser, ordered: list[Run], base: Run
) -> pagecache.Slot | None:
    """Where the comparison of ``ordered`` against ``base`` for ``user`` is kept (``kind``:
    the web page's rendered part, or the API's answer), None while a run is unfinished
    (not kept then): its stamps are each run's ``updated_at`` and the series' stamp; it
    goes with the reference run."""
    if not pagecache.all_final(ordered):
        return None
    stamp = _series_stamp(user, base)
    who = user.pk if user.is_authenticated else "anon"
    changed = [r.updated_at for r in ordered]
    ids = [r.public_id for r in ordered]
    return pagecache.slot(kind, (who, ids, base.public_id), (changed, stamp), base.pk)


@require_GET
def compare_page(request: HttpRequest) -> HttpResponse:
    chosen = [r for r in request.GET.getlist("runs") if r.strip(", ")]
    if not chosen:
        return render(request, "web/compare.html", {"state": "none"})
    try:
        ids, baseline = cmp.parse_selection(chosen, _reference_param(request))
    except cmp.SelectionError as exc:
        context = {"error": f"{exc.field}: {exc}"}
        return render(request, "web/compare.html", context, status=400)
    full = _full_ids(request.user, ids)
    runs = selected_runs(request.user, full)
    if len(runs) != len(full):
        raise _not_found()
    if len(full) == 1:
        return render(request, "web/compare.html", {"state": "one", "run": runs[full[0]]})
    named = _reference_param(request)
    if named and len(named) < PUBLIC_ID_LENGTH:
        baseline = _full_ids(request.user, [baseline])[0]
    elif not named:
        baseline = min(runs.values(), key=lambda r: (r.created_at, r.pk)).public_id
    if baseline not in runs:
        context = {"error": f"reference: the run {baseline[:40]!r} is not among the runs"}
        return render(request, "web/compare.html", context, status=400)
    canonical = compare_url(full, baseline)
    given = (request.GET.getlist("runs"), request.GET.get("reference"), len(request.GET))
    if given != ([",".join(full)], baseline, 2):
        return redirect(canonical)
    ordered = [runs[i] for i in full]
    fresh: dict[str, Any] = {}  # the objects behind the page, when this request built it
    part = cached_part(request.user, ordered, runs[baseline], fresh)
    context = {
        **part,
        "comparison": fresh.get("comparison"),
        "figures": fresh.get("figures"),
        "state": "compare",
        "permalink": request.build_absolute_uri(canonical),
        "api_url": reverse("api:compare")
        + "?"
        + urlencode({"runs": ",".join(full), "reference": baseline}),
    }
    return render(request, "web/compare.html", context)


def cached_part(
    user: AbstractBaseUser | AnonymousUser,
    ordered: list[Run],
    base: Run,
    fresh: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The rendered comparison of ``ordered`` (visible to ``user``) against ``base``: kept
    (``cache_slot``) when every run is finished; ``fresh`` gets the objects behind it when
    built here. Http404 when a run is not visible."""
    fresh = {} if fresh is None else fresh
    ids = [r.public_id for r in ordered]

    def build() -> dict[str, Any]:
        try:
            fresh["comparison"] = cmp.compare(user, ids, base.public_id)
        except Run.DoesNotExist:
            raise _not_found() from None
        fresh["figures"] = figures.compare_figures(fresh["comparison"])
        return comparison_part(fresh["comparison"], fresh["figures"], ids)

    return pagecache.get_or_build(cache_slot("compare", user, ordered, base), build)


def comparison_part(
    comparison: cmp.Comparison, charts: list[dict[str, Any]], ids: list[str]
) -> dict[str, Any]:
    """The comparison rendered (``body``), with what the page's head reads: strings only,
    so a cached one is cheap to read back (a ``Comparison`` of 8 runs x 20 points takes
    ~30 ms to unpickle, ~40x its rendered HTML)."""
    order = tables.column_order(len(comparison.columns), comparison.baseline)
    ranked = sum(c.comparable for c in comparison.columns) >= 3  # a ranking of three or more
    metrics = list({r.metric.key: r.metric for r in comparison.rows}.values())
    output, ttft = comparison.headline(), comparison.headline("p99_ttft_ms")
    headline = [
        {
            "column": comparison.columns[i],
            "colour": color(i),
            "is_baseline": i == comparison.baseline,
            "output": output[i],
            "ttft": ttft[i],
            "counts": comparison.counts(i),
            "baseline_url": compare_url(ids, comparison.columns[i].run.public_id),
        }
        for i in order
    ]
    context = {
        "ids": ids,
        "baseline_run": comparison.baseline_run,
        "not_comparable": [h for h in headline if not h["column"].comparable],
        "changed": [
            comparison.columns[i]
            for i in order
            if i != comparison.baseline and comparison.columns[i].comparable
        ],
        "contended": comparison.contended,
        "ranking": [
            {
                "metric": r["metric"],
                "order": [
                    (comparison.columns[i], change, i == comparison.baseline)
                    for i, change in r["order"]
                ],
            }
            for r in comparison.ranking()
        ]
        if ranked
        else [],
        "ranking_why": comparison.why_winner() if ranked else None,
        "threshold": engine.DEFAULT_THRESHOLD,
        "min_history": engine.MIN_HISTORY,
        "columns": [comparison.columns[i] for i in order],
        "env_diff": [(row.label, [row.values[i] for i in order]) for row in comparison.env_diff],
        "figures": charts,
        "chart_groups": by_sweep(charts),
        "metrics": metrics,
        "headline": headline,
        "tbody": tables.compare_tbody(tables.compare_lines(comparison.rows), order),
        "shared_points": bool(comparison.rows),
    }
    return {
        "body": render_to_string("web/_compare_body.html", context),
        "count": len(comparison.columns),
        "baseline_id": comparison.baseline_run.public_id,
        "baseline_name": comparison.baseline_run.name or comparison.baseline_run.short_id,
    }
