"""REST API v1 views: runs, presets, the spec schema, and /healthz.

Visibility (``queries.run_access``, the one rule): a run is readable by its owner, by
staff, and by anyone if it is public; everyone else gets 404 (never 403: ids do not
leak). Only the owner (or staff) cancels, and only they read whole failure reasons and
runner errors (others get their first line: ``sharing``).
Creating a run needs a signed-in user or a CI token.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.paginator import Paginator
from django.db import connection
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views import defaults
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import permissions, renderers
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.errors import ApiError, json_error
from portal.api.parsers import (
    BodyRefused,
    JSONParser,
    TextYAMLParser,
    XYAMLParser,
    YAMLParser,
    load_yaml,
)
from portal.api.renderers import JSONRenderer
from portal.api.serializers import (
    PresetSerializer,
    RunCreateRequest,
    RunDetailSerializer,
    RunSerializer,
    measurement_rows,
    paginated,
    run_summaries,
)
from portal.benchmarks import documents, intake, lifecycle, presets, queries, samplestore, sharing
from portal.benchmarks.models import Environment, Measurement, Run
from runners import spec as rs

log = logging.getLogger(__name__)


def check_body_size(request: Request | HttpRequest, limit: int) -> None:
    """413 before reading a body larger than ``limit`` bytes."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise ApiError(400, "malformed_body", "invalid Content-Length header") from None
    if length > limit:
        raise ApiError(
            413,
            "body_too_large",
            f"the body is {length} bytes; the limit here is {limit} bytes",
        )


def get_run_or_404(user: Any, public_id: str) -> Run:
    """The run ``public_id`` names (its id, or a unique prefix of it such as the 8-character
    short id) if ``user`` may read it. 404 when there is none (or it is not theirs: the
    same answer); 400 ``ambiguous_id`` when several runs they may read start with it."""
    try:
        return queries.get_visible_run(user, public_id)
    except queries.AmbiguousRunId as exc:
        raise ApiError(
            400,
            "ambiguous_id",
            f"run id prefix {public_id!r} starts {len(exc.matches)}"
            f"{'+' if len(exc.matches) >= 5 else ''} runs you can see; give more of the id",
            [{"field": "id", "message": "ambiguous run id prefix"}],
            matches=[run.public_id for run in exc.matches],
        ) from None
    except Run.DoesNotExist:
        short = len(public_id) < queries.MIN_ID_PREFIX
        raise ApiError(
            404,
            "not_found",
            f"no run {public_id!r} that you can see; "
            + (
                f"give at least {queries.MIN_ID_PREFIX} characters of its id"
                if short
                else "check the id, or sign in as its owner"
            ),
        ) from None


class RunPagination(PageNumberPagination):
    """DRF's page-number pagination; ``count``, when given, is the list's length as
    counted by the caller (``queries.count_runs``) instead of the queryset's COUNT."""

    page_size = 25
    page_size_query_param = "page_size"
    max_page_size = 100

    def __init__(self, count: int | None = None) -> None:
        self.known_count = count

    def django_paginator_class(self, object_list: Any, per_page: int) -> Paginator:
        paginator = Paginator(object_list, per_page)
        if self.known_count is not None:
            paginator.count = self.known_count  # a cached_property: the count is known
        return paginator


# What a list paginated by RunPagination takes (the schema shows them with its envelope,
# ``serializers.paginated``).
PAGE_PARAMS = [
    OpenApiParameter("page", int, description="Page number, from 1."),
    OpenApiParameter(
        "page_size",
        int,
        description=(
            f"Items per page (default {RunPagination.page_size}, at most "
            f"{RunPagination.max_page_size})."
        ),
    ),
]


class YAMLRenderer(renderers.BaseRenderer):
    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None
    ) -> bytes:
        import yaml

        if isinstance(data, str):
            return data.encode()
        return yaml.safe_dump(data, sort_keys=False).encode()


_FILTER_PARAMS = [
    OpenApiParameter("model", str, description="Model id, exactly (e.g. Qwen/Qwen3-0.6B)."),
    OpenApiParameter("gpu", str, description="GPU name, exactly (as captured by the runner)."),
    OpenApiParameter("backend", str, description="Backend kind or name (hf-sequential, vllm)."),
    OpenApiParameter("status", str, enum=[s for s, _ in Run._meta.get_field("status").choices]),
    OpenApiParameter("owner", str, description="'me' or a username."),
]


class RunListCreate(APIView):
    parser_classes = [JSONParser, YAMLParser, TextYAMLParser, XYAMLParser]

    def get_permissions(self) -> list[Any]:
        if self.request.method == "POST":
            return [permissions.IsAuthenticated()]
        return [permissions.AllowAny()]

    @extend_schema(
        operation_id="runs_list",
        parameters=[*_FILTER_PARAMS, *PAGE_PARAMS],
        responses=paginated(RunSerializer),
        description="Runs you can see (yours and public ones), newest first, paginated.",
    )
    def get(self, request: Request) -> Response:
        filters = queries.RunFilters.from_params(request.query_params)
        runs = queries.run_list(request.user, filters)
        paginator = RunPagination(count=queries.count_runs(request.user, filters))
        page = paginator.paginate_queryset(runs, request, view=self)
        return paginator.get_paginated_response(run_summaries(page, request))

    @extend_schema(
        operation_id="runs_create",
        request={"application/json": RunCreateRequest, "application/yaml": OpenApiTypes.STR},
        responses={201: RunSerializer, 400: OpenApiResponse(description="Invalid spec.")},
        parameters=[
            OpenApiParameter("name", str, description="Run name (instead of the body's)."),
            OpenApiParameter(
                "is_public", bool, description="Readable without sign-in (instead of the body's)."
            ),
        ],
        description=(
            'Submit a run: JSON `{"spec": {...}}` or `{"preset": "seed"}` (optional '
            "`name`, `is_public`), or a raw YAML spec with Content-Type application/yaml. "
            "`?name=` and `?is_public=` apply to either body (given in both, they must "
            "agree). Invalid specs get 400 naming the field; nothing is queued. So does a "
            "spec asking for what this portal's executor cannot give (more GPUs than it "
            "has); what may fail later (a hub model not in the cache while downloads are "
            "off) is queued and listed under `warnings`."
        ),
    )
    def post(self, request: Request) -> Response:
        check_body_size(request, settings.SERVEBENCH_MAX_SPEC_BYTES)
        raw_yaml = bool(request.content_type and "yaml" in request.content_type)
        try:
            data = request.data
        except BodyRefused as exc:  # a raw YAML body is the spec: its fields are spec.*
            raise exc.under("spec") if raw_yaml else exc from None
        if raw_yaml:
            data = {"spec": data}
        if isinstance(data, dict) and isinstance(data.get("spec"), str):
            # A spec given as YAML/JSON text inside the JSON body.
            try:
                data = {**data, "spec": load_yaml(data["spec"])}
            except BodyRefused as exc:
                raise exc.under("spec") from None
        if isinstance(data, dict):
            data = {**data, **_create_params(request, data)}
        req = intake.spec_from_request(data, request.user)
        run = intake.create_run(
            request.user, req.spec, req.name, is_public=req.is_public, token=request.auth
        )
        body = dict(RunSerializer(run, context={"request": request}).data)
        if req.warnings:
            # What the executor may not give it (preflight): queued anyway, said at once.
            body["warnings"] = list(req.warnings)
        return Response(body, status=201, headers={"Location": body["links"]["self"]})


def _create_params(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    """``?name=`` and ``?is_public=`` of a create request, read the same way whatever the
    body's type; SpecError naming the parameter when one is given twice, cannot be read,
    or disagrees with the body. Run names are text without control characters."""
    params: dict[str, Any] = {}
    for key in ("name", "is_public"):
        values = request.query_params.getlist(key)
        if not values:
            continue
        if len(values) > 1:
            raise rs.SpecError([{"field": key, "message": f"give ?{key}= once"}])
        value: Any = values[0]
        if key == "is_public":
            if value.lower() not in ("true", "false", "1", "0"):
                raise rs.SpecError([{"field": key, "message": "?is_public= must be true or false"}])
            value = value.lower() in ("true", "1")
        if key in body and body[key] != value:
            raise rs.SpecError(
                [
                    {
                        "field": key,
                        "message": f"{key} is given in the query and in the body with "
                        "different values; give it once",
                    }
                ]
            )
        params[key] = value
    name = params.get("name", body.get("name"))
    if isinstance(name, str) and (why := rs.free_text_problem(name)):
        raise rs.SpecError([{"field": "name", "message": f"a run name {why}"}])
    return params


class RunDetail(APIView):
    @extend_schema(operation_id="runs_retrieve", responses=RunDetailSerializer)
    def get(self, request: Request, public_id: str) -> Response:
        run = get_run_or_404(request.user, public_id)
        context = {
            "request": request,
            "measurements": measurement_rows(run, request.user),
            "environment": Environment.objects.filter(run=run).first(),
        }
        return Response(RunDetailSerializer(run, context=context).data)


class RunResult(APIView):
    @extend_schema(
        operation_id="runs_result",
        responses={200: OpenApiTypes.OBJECT},
        description="The result document (runners.result.ResultDocument), as the runner's --out.",
        parameters=[OpenApiParameter("download", bool, description="As an attachment.")],
    )
    def get(self, request: Request, public_id: str) -> Response:
        run = get_run_or_404(request.user, public_id)
        response = Response(sharing.document_for(request.user, run, documents.result_document(run)))
        if request.query_params.get("download"):
            response["Content-Disposition"] = (
                f'attachment; filename="servebench-{run.public_id}-result.json"'
            )
        return response


class RunSamples(APIView):
    @extend_schema(
        operation_id="runs_samples",
        responses={(200, "application/gzip"): OpenApiTypes.BINARY},
        description=(
            "One measurement's per-request samples as stored (gzip-compressed JSON of the "
            "arrays), streamed: the full arrays of a point too large to travel inline "
            "(samples_full in the result document), else the arrays themselves. Query: "
            "backend, point, repeat (as in the result document)."
        ),
        parameters=[
            OpenApiParameter("backend", str, required=True),
            OpenApiParameter("point", str, required=True),
            OpenApiParameter("repeat", int, required=True),
        ],
    )
    def get(self, request: Request, public_id: str) -> HttpResponse:
        run = get_run_or_404(request.user, public_id)
        query = request.query_params
        try:
            repeat = int(query.get("repeat", "0"))
        except ValueError:
            repeat = -1
        if not 0 <= repeat < 2**31:
            raise ApiError(400, "invalid", "repeat: a whole number from 0") from None
        row = (
            Measurement.objects.filter(
                run=run,
                backend=query.get("backend", ""),
                point_key=query.get("point", ""),
                repeat=repeat,
            )
            .exclude(samples="")
            .values_list("samples", "samples_full")
            .first()
        )
        if row is None:
            raise ApiError(
                404,
                "not_found",
                "this run has no stored samples for that backend, point and repeat (see the "
                "result document's measurements; samples past their retention are deleted)",
            )
        name = samplestore.full_name(row[0]) if row[1] else row[0]
        try:
            stream = samplestore.open_stream(name)
        except FileNotFoundError:
            raise ApiError(404, "not_found", "these samples were deleted (retention)") from None
        response = FileResponse(stream, content_type="application/gzip")
        response["Content-Disposition"] = (
            f'attachment; filename="servebench-{run.public_id}-samples-{repeat}.json.gz"'
        )
        return response


class RunSpec(APIView):
    renderer_classes = [YAMLRenderer, JSONRenderer]

    @extend_schema(
        operation_id="runs_spec",
        responses={
            (200, "application/yaml"): OpenApiTypes.STR,
            (200, "application/json"): OpenApiTypes.OBJECT,
        },
        description="The spec as executed: YAML by default, JSON with ?format=json.",
    )
    def get(self, request: Request, public_id: str) -> Response:
        run = get_run_or_404(request.user, public_id)
        spec = rs.parse_spec(run.spec, stored=True)
        fmt = request.accepted_renderer.format
        data: Any = (
            rs.dump_spec(spec, "yaml")
            if fmt == "yaml"
            else rs.whole_numbers(spec.model_dump(mode="json", exclude_none=True))
        )
        response = Response(data)
        if request.query_params.get("download"):
            response["Content-Disposition"] = (
                f'attachment; filename="servebench-{run.public_id}-spec.{fmt}"'
            )
        return response


class RunCancel(APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(
        operation_id="runs_cancel",
        request=None,
        responses={202: RunSerializer, 409: OpenApiResponse(description="Already ended.")},
    )
    def post(self, request: Request, public_id: str) -> Response:
        run = get_run_or_404(request.user, public_id)
        if not queries.may_manage(request.user, run):
            raise ApiError(403, "forbidden", "only the run's owner can cancel it")
        if not lifecycle.cancel_run(run, by=request.user):
            run.refresh_from_db()
            raise ApiError(
                409,
                "run_finished",
                f"the run already ended ({run.status}); nothing to cancel",
                run_status=run.status,
            )
        return Response(RunSerializer(run, context={"request": request}).data, status=202)


class Presets(APIView):
    @extend_schema(operation_id="presets_list", responses=PresetSerializer(many=True))
    def get(self, request: Request) -> Response:
        data = [
            {
                "name": name,
                "title": entry["title"],
                "description": entry["description"],
                "spec": rs.whole_numbers(
                    entry["build"]().model_dump(mode="json", exclude_none=True)
                ),
            }
            for name, entry in sorted(presets.available().items())
        ]
        return Response(data)


class SpecSchema(APIView):
    @extend_schema(
        operation_id="spec_schema",
        responses={200: OpenApiTypes.OBJECT},
        description="The JSON Schema of a spec (exported from runners.spec.Spec).",
    )
    def get(self, request: Request) -> Response:
        return Response(rs.json_schema())


def broker_status(timeout: float = 2.0) -> str:
    """'ok' or why the Celery broker cannot be reached."""
    from portal.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)
            conn.default_channel  # noqa: B018 - opens a channel: a real round trip
    except Exception as exc:  # kombu/redis raise many types
        return f"unreachable: {exc.__class__.__name__}: {exc}"
    return "ok"


@never_cache
@require_GET
def healthz(request: HttpRequest) -> HttpResponse:
    """200 when the database answers (broker state reported, not required: runs wait in
    the queue); 503 when the database does not."""
    body: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        body["database"] = "ok"
    except Exception as exc:
        body["database"] = f"unreachable: {exc.__class__.__name__}"
    body["broker"] = broker_status()
    healthy = body["database"] == "ok"
    body["status"] = (
        "ok" if healthy and body["broker"] == "ok" else ("degraded" if healthy else "down")
    )
    return JsonResponse(body, status=200 if healthy else 503)


# --------------------------------------------------------------------------- handlers
# Django's error views, but JSON under /api/ (wired in portal/urls.py).


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _is_api(request):
        return json_error(400, "bad_request", "the request could not be read; check its body")
    return defaults.bad_request(request, exception)


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _is_api(request):
        return json_error(404, "not_found", f"no API endpoint at {request.path}; see /api/v1/docs/")
    # The project's page (portal/web/templates/404.html); a run page's 404 carries its own
    # message and, for an ambiguous id prefix, the visitor's runs it starts.
    context = {
        "message": getattr(exception, "message", ""),
        "matches": getattr(exception, "matches", []),
    }
    return render(request, "404.html", context, status=404)


def handler500(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return json_error(500, "server_error", "internal error; it has been logged")
    return defaults.server_error(request)
