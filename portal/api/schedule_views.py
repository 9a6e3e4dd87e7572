"""Schedules in the REST API (rules in ``portal.schedules.editing``).

- ``GET /api/v1/schedules/``: yours (staff: everyone's). ``POST`` a schedule
  (``{"name", "label", "spec" | "preset", "cadence": "daily", "at": "02:30"}`` or
  ``"cadence": "hours", "every_hours": 4``): 201; 400 naming the field (``spec.*`` for
  the spec's), 403 what your account may not run, 409 too many schedules.
- ``GET`` / ``PATCH`` (``{"enabled": false}`` pauses, ``true`` resumes) / ``DELETE``
  ``/api/v1/schedules/{id}/``: yours only (404 otherwise). Its runs stay when deleted.
- ``GET /api/v1/schedules/{id}/firings``: its recent slots, each a run or a refusal.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.errors import ApiError
from portal.api.parsers import JSONParser
from portal.schedules import editing
from portal.schedules.models import Firing, Schedule


class ScheduleSerializer(serializers.Serializer):
    id = serializers.CharField()
    name = serializers.CharField()
    owner = serializers.CharField()
    label = serializers.CharField()
    cadence = serializers.CharField()
    at = serializers.CharField(help_text="HH:MM UTC.")
    every_hours = serializers.IntegerField(allow_null=True)
    description = serializers.CharField()
    enabled = serializers.BooleanField()
    is_public = serializers.BooleanField()
    next_run_at = serializers.DateTimeField()
    last_run = serializers.CharField(allow_null=True)
    last_error = serializers.CharField()
    created_at = serializers.DateTimeField()


class FiringSerializer(serializers.Serializer):
    due_at = serializers.DateTimeField()
    fired_at = serializers.DateTimeField()
    run = serializers.CharField(allow_null=True)
    refusal = serializers.CharField()


def schedule_row(s: Schedule) -> dict[str, Any]:
    return {
        "id": s.public_id,
        "name": s.name,
        "owner": s.owner.get_username(),
        "label": s.label,
        "cadence": s.cadence,
        "at": s.at_time.strftime("%H:%M"),
        "every_hours": s.every_hours,
        "description": s.describe(),
        "enabled": s.enabled,
        "is_public": s.is_public,
        "next_run_at": s.next_run_at,
        "last_run": s.last_run.public_id if s.last_run_id and s.last_run else None,
        "last_error": s.last_error,
        "created_at": s.created_at,
    }


def firing_row(f: Firing) -> dict[str, Any]:
    return {
        "due_at": f.due_at,
        "fired_at": f.fired_at,
        "run": f.run.public_id if f.run is not None else None,
        "refusal": f.refusal,
    }


def _error(exc: editing.ScheduleError) -> ApiError:
    code = {403: "forbidden_field", 409: "conflict"}.get(exc.status, "invalid")
    return ApiError(exc.status, code, f"{exc.field}: {exc}" if exc.field else str(exc), exc.errors)


def _mine(request: Request, public_id: str) -> Schedule:
    try:
        return editing.get(request.user, public_id)
    except Schedule.DoesNotExist:
        raise ApiError(404, "not_found", f"no schedule {public_id[:20]!r} of yours") from None


class Schedules(APIView):
    parser_classes = [JSONParser]
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(operation_id="schedules_list", responses=ScheduleSerializer(many=True))
    def get(self, request: Request) -> Response:
        return Response([schedule_row(s) for s in editing.visible(request.user)])

    @extend_schema(
        operation_id="schedules_create",
        request=OpenApiTypes.OBJECT,
        responses={
            201: ScheduleSerializer,
            400: OpenApiResponse(description="A field is invalid (named)."),
            403: OpenApiResponse(description="The spec asks for what you may not run."),
            409: OpenApiResponse(description="Too many schedules."),
        },
        description=(
            "Run a spec on a schedule, labelled into a series: `cadence` `daily` at `at` "
            "(HH:MM UTC), or `hours` every `every_hours` from `at`. Each run goes through "
            "the normal submission (fair use applies)."
        ),
    )
    def post(self, request: Request) -> Response:
        try:
            schedule = editing.create(request.user, request.data)
        except editing.ScheduleError as exc:
            raise _error(exc) from None
        return Response(schedule_row(schedule), status=201)


class ScheduleDetail(APIView):
    parser_classes = [JSONParser]
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(operation_id="schedules_retrieve", responses=ScheduleSerializer)
    def get(self, request: Request, public_id: str) -> Response:
        return Response(schedule_row(_mine(request, public_id)))

    @extend_schema(
        operation_id="schedules_update",
        request=OpenApiTypes.OBJECT,
        responses=ScheduleSerializer,
        description='Pause (`{"enabled": false}`) or resume (`{"enabled": true}`).',
    )
    def patch(self, request: Request, public_id: str) -> Response:
        schedule = _mine(request, public_id)
        data = request.data
        if not isinstance(data, dict) or set(data) != {"enabled"}:
            raise ApiError(
                400,
                "invalid",
                'send {"enabled": true} or {"enabled": false}; other fields cannot change '
                "(delete the schedule and create another)",
                [{"field": "enabled", "message": "required, and the only field"}],
            )
        if not isinstance(data["enabled"], bool):
            raise ApiError(
                400,
                "invalid",
                "enabled is true or false",
                [{"field": "enabled", "message": "a boolean"}],
            )
        return Response(schedule_row(editing.set_enabled(schedule, data["enabled"])))

    @extend_schema(operation_id="schedules_destroy", responses={204: None})
    def delete(self, request: Request, public_id: str) -> Response:
        _mine(request, public_id).delete()
        return Response(status=204)


class ScheduleFirings(APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(operation_id="schedules_firings", responses=FiringSerializer(many=True))
    def get(self, request: Request, public_id: str) -> Response:
        schedule = _mine(request, public_id)
        return Response([firing_row(f) for f in editing.history(schedule, 100)])
