"""Labels in the REST API (rules in ``portal.benchmarks.baselines``): a CI pipeline labels
the runs of its main branch, and ``latest:<label>`` is the newest labelled run of a
workload. (They were called "baselines"; the old routes still answer, deprecated.)

- ``POST /api/v1/runs/{id}/labels`` ``{"label": "main"}``: label (owner or staff).
  201 when labelled, 200 when it already was; 401 anonymous, 403 a reader who is not the
  owner, 404 a run you cannot see, 409 a failed or cancelled run.
- ``DELETE /api/v1/runs/{id}/labels?label=main``: remove; 204, or 404 if not labelled.
- ``GET /api/v1/labels/?label=&fingerprint=&owner=``: labels on runs you can see,
  newest run first, paginated.
- ``GET /api/v1/runs/resolve?ref=latest:main&fingerprint=&before=&owner=``: the run a
  reference names (``latest:<label>`` or a run id), as ``GET /runs/{id}/`` lists it.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.errors import ApiError
from portal.api.parsers import JSONParser
from portal.api.serializers import RunSerializer, paginated, run_summaries
from portal.api.views import PAGE_PARAMS, RunPagination, get_run_or_404
from portal.benchmarks import baselines
from portal.benchmarks.models import Baseline


class BaselineRequest(serializers.Serializer):
    label = serializers.CharField(
        max_length=100, help_text="The series label, e.g. the branch name: main."
    )


class BaselineSerializer(serializers.Serializer):
    label = serializers.CharField()
    run = RunSerializer()
    set_by = serializers.CharField(allow_null=True)
    set_at = serializers.DateTimeField()


def _api_error(exc: baselines.BaselineError) -> ApiError:
    fields = [{"field": exc.field, "message": exc.message}] if exc.field else None
    return ApiError(exc.status, exc.code, exc.message, fields)


def mark_rows(marks: list[Baseline], request: Request) -> list[dict[str, Any]]:
    """Marks as BaselineSerializer's JSON; runs through ``run_summaries`` (no N+1)."""
    runs = run_summaries([m.run for m in marks], request)
    return [
        {
            "label": m.label,
            "run": run,
            "set_by": m.set_by.get_username() if m.set_by is not None else None,
            "set_at": m.set_at,
        }
        for m, run in zip(marks, runs, strict=True)
    ]


def _label(request: Request) -> str:
    data = request.data if request.method == "POST" else request.query_params
    if request.method == "POST" and not isinstance(data, dict):
        raise ApiError(400, "malformed_body", 'send a JSON object: {"label": "main"}')
    try:
        return baselines.validate_label(data.get("label"))
    except baselines.BaselineError as exc:
        raise _api_error(exc) from None


class RunBaseline(APIView):
    parser_classes = [JSONParser]
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(
        operation_id="runs_label_set",
        request=BaselineRequest,
        responses={
            201: BaselineSerializer,
            200: BaselineSerializer,
            409: OpenApiResponse(description="The run failed or was cancelled."),
        },
        description=(
            "Label the run (owner only), e.g. with its branch: main. `latest:<label>` then "
            "resolves to the newest succeeded run so labelled that measured the same "
            "workload on the same hardware."
        ),
    )
    def post(self, request: Request, public_id: str) -> Response:
        run = get_run_or_404(request.user, public_id)
        label = _label(request)
        try:
            mark, created = baselines.mark(run, request.user, label)
        except PermissionError as exc:
            raise ApiError(403, "forbidden", f"{exc}; ask them, or mark a run of yours") from None
        except baselines.BaselineError as exc:
            raise _api_error(exc) from None
        mark.run = run
        return Response(mark_rows([mark], request)[0], status=201 if created else 200)

    @extend_schema(
        operation_id="runs_label_unset",
        parameters=[OpenApiParameter("label", str, required=True)],
        responses={204: None},
        description="Remove the run's label `label` (owner only).",
    )
    def delete(self, request: Request, public_id: str) -> Response:
        run = get_run_or_404(request.user, public_id)
        label = _label(request)
        try:
            removed = baselines.unmark(run, request.user, label)
        except PermissionError as exc:
            raise ApiError(403, "forbidden", str(exc)) from None
        if not removed:
            raise ApiError(
                404,
                "not_found",
                f"run {run.short_id} is not labelled {label!r}; GET /api/v1/labels/ lists labels",
                [{"field": "label", "message": "not marked with this label"}],
            )
        return Response(status=204)


LIST_PARAMS = [
    OpenApiParameter("label", str, description="Exactly this label."),
    OpenApiParameter("fingerprint", str, description="Runs of this fingerprint."),
    OpenApiParameter("owner", str, description="'me' or a username."),
    *PAGE_PARAMS,
]


class BaselineList(APIView):
    @extend_schema(
        operation_id="labels_list",
        parameters=LIST_PARAMS,
        responses=paginated(BaselineSerializer),
        description="Labels on runs you can see, newest run first, paginated.",
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        try:
            marks = baselines.visible_marks(
                request.user,
                label=params.get("label", "").strip(),
                fingerprint=params.get("fingerprint", "").strip()[:64],
                owner=params.get("owner", "").strip()[:150],
            )
        except baselines.BaselineError as exc:
            raise _api_error(exc) from None
        paginator = RunPagination()
        page = paginator.paginate_queryset(marks, request, view=self)
        return paginator.get_paginated_response(mark_rows(list(page), request))


class ResolveRun(APIView):
    @extend_schema(
        operation_id="runs_resolve",
        parameters=[
            OpenApiParameter("ref", str, required=True, description="A run id, or latest:<label>."),
            OpenApiParameter("fingerprint", str, description="The series' fingerprint."),
            OpenApiParameter("before", str, description="A run id: only runs created before it."),
            OpenApiParameter(
                "owner", str, description="Whose runs latest: searches (default: yours)."
            ),
        ],
        responses={
            200: RunSerializer,
            404: OpenApiResponse(description="No such run, or no baseline in the series."),
            409: OpenApiResponse(description="The label marks several series."),
        },
        description=(
            "The run a reference names. `latest:<label>` is the newest succeeded run of the "
            "series (fingerprint + label) among the owner's runs."
        ),
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        owner = params.get("owner", "").strip()[:150]
        try:
            run = baselines.resolve(
                request.user,
                params.get("ref", ""),
                fingerprint=params.get("fingerprint", "").strip()[:64],
                before=params.get("before", "").strip()[:40],
                owner=owner,
            )
        except baselines.BaselineError as exc:
            raise _api_error(_about_someone(exc, request, owner)) from None
        return Response(RunSerializer(run, context={"request": request}).data)


def _about_someone(
    exc: baselines.BaselineError, request: Request, owner: str
) -> baselines.BaselineError:
    """The same answer whether or not ``owner`` names a user: a caller must not learn
    from ``resolve?owner=`` who has an account, only what runs they may see."""
    mine = owner in ("", "me") or (
        request.user.is_authenticated and owner == request.user.get_username()
    )
    if mine or exc.status != 404:
        return exc
    try:
        kind, label = baselines.parse_ref(request.query_params.get("ref", ""))
    except baselines.BaselineError:
        return exc
    if kind != "latest":
        return exc
    return baselines.BaselineError(
        404,
        "no_baseline",
        f"no run of owner {owner[:60]!r} that you can see is marked {label!r}; check the "
        "owner and the label, or compare with an explicit run id",
        "ref",
    )


class OldRunBaseline(RunBaseline):
    """``/runs/{id}/baseline``: the old route of ``RunBaseline`` (deprecated)."""

    @extend_schema(operation_id="runs_baseline_set_old", deprecated=True, request=BaselineRequest)
    def post(self, request: Request, public_id: str) -> Response:
        return super().post(request, public_id)

    @extend_schema(
        operation_id="runs_baseline_unset_old",
        deprecated=True,
        parameters=[OpenApiParameter("label", str, required=True)],
        responses={204: None},
    )
    def delete(self, request: Request, public_id: str) -> Response:
        return super().delete(request, public_id)


class OldBaselineList(BaselineList):
    """``/baselines/``: the old route of ``BaselineList`` (deprecated)."""

    @extend_schema(
        operation_id="baselines_list_old",
        deprecated=True,
        parameters=LIST_PARAMS,
        responses=paginated(BaselineSerializer),
    )
    def get(self, request: Request) -> Response:
        return super().get(request)
