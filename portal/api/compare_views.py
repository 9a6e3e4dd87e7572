"""Comparison and history endpoints (read-only; visibility as for single runs).

- ``GET /api/v1/compare/?runs=a,b,c&baseline=a``: each metric per point for every run,
  the relative difference to the baseline run, and the environment fields that differ.
  404 if any run is not visible to the caller; 400 naming the parameter for a bad one.
- ``GET /api/v1/history/?fingerprint=F&metric=output_throughput&point=K[&backend=B]``:
  one value per run of the comparable series, oldest first, with the versions each ran
  on and what changed from the previous run.
"""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.errors import ApiError
from portal.benchmarks import compare as cmp
from portal.benchmarks import history as hist
from portal.benchmarks.models import Run


class Compare(APIView):
    @extend_schema(
        operation_id="compare",
        parameters=[
            OpenApiParameter("runs", str, required=True, description="Run ids, comma-separated."),
            OpenApiParameter("baseline", str, description="One of the runs (default: the first)."),
        ],
        responses={200: OpenApiTypes.OBJECT},
        description=(
            "Each metric per point for every run, `relative_to_baseline` = value / "
            "baseline's - 1 (null for the baseline or where either is missing), and "
            "`environment_diff`: only the fields whose values differ."
        ),
    )
    def get(self, request: Request) -> Response:
        try:
            ids, baseline = cmp.parse_selection(
                request.query_params.getlist("runs"), request.query_params.get("baseline")
            )
        except cmp.SelectionError as exc:
            raise ApiError(
                400, "invalid_parameter", str(exc), [{"field": exc.field, "message": str(exc)}]
            ) from None
        try:
            comparison = cmp.compare(request.user, ids, baseline)
        except Run.DoesNotExist as exc:
            raise ApiError(404, "not_found", f"{exc}; check the ids, or sign in") from None
        return Response(comparison.as_dict())


class History(APIView):
    @extend_schema(
        operation_id="history",
        parameters=[
            OpenApiParameter("fingerprint", str, required=True, description="Run.fingerprint."),
            OpenApiParameter("metric", str, enum=list(hist.HISTORY_METRICS)),
            OpenApiParameter("point", str, description="Point key; default: top concurrency."),
            OpenApiParameter("backend", str, description="Backend name (default: the point's)."),
        ],
        responses={200: OpenApiTypes.OBJECT},
        description="One value per run of a comparable series (same fingerprint), in time order.",
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        try:
            history = hist.history(
                request.user,
                params.get("fingerprint", ""),
                params.get("metric") or "output_throughput",
                params.get("point") or None,
                params.get("backend") or None,
            )
        except hist.HistoryError as exc:
            raise ApiError(
                400, "invalid_parameter", str(exc), [{"field": exc.field, "message": str(exc)}]
            ) from None
        except Run.DoesNotExist:
            raise ApiError(
                404, "not_found", "no run with this fingerprint that you can see"
            ) from None
        return Response(history.as_dict())
