"""Comparison and history endpoints (read-only; visibility as for single runs).

- ``GET /api/v1/compare/?runs=a,b,c&reference=a``: each metric per point for every run,
  the relative difference to the baseline run, and the environment fields that differ.
  404 if any run is not visible to the caller; 400 naming the parameter for a bad one.
- ``GET /api/v1/history/?fingerprint=F&metric=output_throughput&point=K[&backend=B]``:
  one value per run of the comparable series, oldest first, with the versions each ran
  on and what changed from the previous run.
- ``GET /api/v1/history/?fingerprint=F&point=*&owner=U&before=RUN``: every point and
  judged metric at once, for the verdict's run-to-run noise: the newest
  ``servebench.verdict.LOOKBACK`` succeeded runs of U's series created before RUN.

The compare answer carries the engine's verdict per run and metric (``rows[].verdicts``),
the same ``servebench compare`` computes from the result documents.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.http import Http404, HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api import renderers
from portal.api.errors import ApiError
from portal.benchmarks import compare as cmp
from portal.benchmarks import history as hist
from portal.benchmarks import queries
from portal.benchmarks.models import Run
from portal.web import pagecache
from portal.web.views import compare as compare_page
from portal.web.views import history as history_page
from servebench import verdict


def _json(body: bytes) -> HttpResponse:
    """An answer rendered once (``renderers.JSONRenderer``, as a ``Response`` renders it), kept
    in the pages cache: a finished comparison or history is served without recomputing
    its verdicts or re-encoding it."""
    return HttpResponse(body, content_type="application/json")


class Compare(APIView):
    @extend_schema(
        operation_id="compare",
        parameters=[
            OpenApiParameter("runs", str, required=True, description="Run ids, comma-separated."),
            OpenApiParameter(
                "reference",
                str,
                description="The reference run, one of the runs (default: the first).",
            ),
            OpenApiParameter(
                "baseline", str, deprecated=True, description="The old name of `reference`."
            ),
        ],
        responses={200: OpenApiTypes.OBJECT},
        description=(
            "Each metric per point for every run, `relative_to_baseline` = value / the "
            "reference run's - 1 (null for the reference or where either is missing), "
            "`verdicts`: the verdict engine's judgement of each run against the reference "
            "(worse / better / within noise / within threshold / noise not measured / no "
            "data / not comparable, with the interval, its method and the noise source; "
            "null for the reference and for metrics that are not judged), per run "
            "`comparable` (the same workload and hardware) with the measurement's "
            "`differences` when not, `changes` (what it changed in configuration and "
            "software: the change judged), `quality_note` and `contended` (points measured "
            "under CPU contention); `ranking` per metric, and `environment_diff`: only the "
            "fields whose values differ."
        ),
    )
    def get(self, request: Request) -> Response:
        try:
            params = request.query_params
            field = "reference" if params.get("reference") else "baseline"
            ids, baseline = cmp.parse_selection(
                params.getlist("runs"), params.get(field), field=field
            )
        except cmp.SelectionError as exc:
            raise ApiError(
                400, "invalid_parameter", str(exc), [{"field": exc.field, "message": str(exc)}]
            ) from None
        runs = compare_page.selected_runs(request.user, ids)
        where: pagecache.Slot | None = None
        if len(runs) == len(ids) and baseline in runs:
            ordered = [runs[i] for i in ids]
            where = compare_page.cache_slot("compare-api", request.user, ordered, runs[baseline])

        def build() -> bytes:
            found = cmp.compare(request.user, ids, baseline)
            return renderers.JSONRenderer().render(found.as_dict())

        try:
            return _json(pagecache.get_or_build(where, build))
        except Run.DoesNotExist as exc:
            raise ApiError(404, "not_found", f"{exc}; check the ids, or sign in") from None


class History(APIView):
    @extend_schema(
        operation_id="history",
        parameters=[
            OpenApiParameter("fingerprint", str, required=True, description="Run.fingerprint."),
            OpenApiParameter("metric", str, enum=list(hist.HISTORY_METRICS)),
            OpenApiParameter(
                "point", str, description="Point key; default: top concurrency; `*`: all."
            ),
            OpenApiParameter("backend", str, description="Backend name (default: the point's)."),
            OpenApiParameter("owner", str, description="With point=*: whose runs (username)."),
            OpenApiParameter("before", str, description="With point=*: runs before this run."),
            OpenApiParameter(
                "configuration",
                str,
                description="With point=*: only runs of this Run.config_fingerprint.",
            ),
        ],
        responses={200: OpenApiTypes.OBJECT},
        description=(
            "One value per run of a comparable series (same fingerprint), in time order. "
            "With `point=*`, `owner` and `before`: the run-to-run noise the verdict uses, "
            "`runs` (oldest first) and per backend, point and metric the runs' `values`."
        ),
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        if params.get("point") == "*":
            return Response(self._noise(request))
        fingerprint = params.get("fingerprint", "")
        metric = params.get("metric") or "output_throughput"
        point, backend = params.get("point") or None, params.get("backend") or None
        where: pagecache.Slot | None = None
        if hist.FINGERPRINT_RE.match(fingerprint):
            try:
                where = history_page.cache_slot(
                    request.user, fingerprint, metric, point, backend, kind="history-api"
                )
            except Http404:  # none visible: built below, which answers why
                where = None

        def build() -> bytes:
            found = hist.history(request.user, fingerprint, metric, point, backend)
            return renderers.JSONRenderer().render(found.as_dict())

        try:
            return _json(pagecache.get_or_build(where, build))
        except hist.HistoryError as exc:
            raise ApiError(
                400, "invalid_parameter", str(exc), [{"field": exc.field, "message": str(exc)}]
            ) from None
        except Run.DoesNotExist:
            raise ApiError(
                404, "not_found", "no run with this fingerprint that you can see"
            ) from None

    def _noise(self, request: Request) -> dict[str, Any]:
        params = request.query_params
        fingerprint = params.get("fingerprint", "")
        configuration = params.get("configuration", "")
        problems = [] if hist.FINGERPRINT_RE.match(fingerprint) else ["fingerprint"]
        if configuration and not hist.FINGERPRINT_RE.match(configuration):
            problems.append("configuration")
        problems += [name for name in ("owner", "before") if not params.get(name)]
        if problems:
            message = (
                f"{problems[0]}: required with point=* (a run's fingerprint, a username, a run id)"
            )
            raise ApiError(
                400, "invalid_parameter", message, [{"field": problems[0], "message": message}]
            )
        owner = get_user_model().objects.filter(username=params["owner"]).first()
        try:
            before = queries.get_visible_run(request.user, params["before"])
        except Run.DoesNotExist:
            raise ApiError(404, "not_found", "no run 'before' that you can see") from None
        if owner is None:
            raise ApiError(404, "not_found", f"no user {params['owner'][:60]!r}")
        runs, values = hist.noise_history(
            request.user, fingerprint, owner.pk, before, configuration=configuration
        )
        return {
            "fingerprint": fingerprint,
            "configuration": configuration,
            "owner": owner.get_username(),
            "before": before.public_id,
            "lookback": verdict.LOOKBACK,
            "runs": [{"id": r.public_id, "created_at": r.created_at.isoformat()} for r in runs],
            "series": [
                {"backend": backend, "point": point, "metric": metric, "values": series}
                for (backend, point), metrics in values.items()
                for metric, series in metrics.items()
            ],
        }
