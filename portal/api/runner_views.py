"""Runner -> portal ingestion (docs/protocol.md), authenticated with the run's own token.

``POST /api/v1/runner/runs/{id}/events``        -> 200 {"ok": true, "run_status": ...}
``POST /api/v1/runner/runs/{id}/measurements``  -> 201 created | 200 already stored

401 without a valid run token, 403 with another run's token, 404 for an unknown run,
409 once the run has ended (the runner stops), 400 for a body that does not validate.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from pydantic import BaseModel, ValidationError
from rest_framework import permissions
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.auth import RunTokenAuthentication
from portal.api.errors import ApiError
from portal.api.parsers import JSONParser
from portal.api.serializers import AcceptedSerializer, MeasurementAcceptedSerializer
from portal.api.views import check_body_size
from portal.benchmarks import services
from portal.benchmarks.models import Run
from portal.lib.logctx import bound_run
from runners import result as rr
from runners.spec import errors_from


def _validate(model: type[BaseModel], data: Any) -> Any:
    if not isinstance(data, dict):
        raise ApiError(400, "invalid", "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        fields = errors_from(exc)
        first = fields[0]
        raise ApiError(400, "invalid", f"{first['field']}: {first['message']}", fields) from None


class RunnerView(APIView):
    authentication_classes = [RunTokenAuthentication]
    permission_classes = [permissions.IsAuthenticated]
    parser_classes = [JSONParser]
    body_limit = 1_000_000

    def run_for(self, request: Request, public_id: str) -> Run:
        run = Run.objects.filter(public_id=public_id).first()
        if run is None:
            raise ApiError(404, "not_found", f"no run {public_id!r}")
        if request.auth.run_id != run.pk:
            raise ApiError(403, "wrong_run", "this run token belongs to another run")
        return run


class RunnerEvents(RunnerView):
    @extend_schema(
        operation_id="runner_event",
        request=OpenApiTypes.OBJECT,
        responses={200: AcceptedSerializer},
        description="A runner lifecycle event (runners.result.Event).",
    )
    def post(self, request: Request, public_id: str) -> Response:
        check_body_size(request, self.body_limit)
        run = self.run_for(request, public_id)
        with bound_run(run.public_id):
            event = _validate(rr.Event, request.data)
            status = services.ingest_event(run, event)
        return Response({"ok": True, "run_status": status})


class RunnerMeasurements(RunnerView):
    @extend_schema(
        operation_id="runner_measurement",
        request=OpenApiTypes.OBJECT,
        responses={200: MeasurementAcceptedSerializer, 201: MeasurementAcceptedSerializer},
        description=(
            "One measurement (runners.result.Measurement); idempotent on (backend, "
            "point.key, repeat)."
        ),
    )
    def post(self, request: Request, public_id: str) -> Response:
        check_body_size(request, settings.SERVEBENCH_MAX_MEASUREMENT_BYTES)
        run = self.run_for(request, public_id)
        with bound_run(run.public_id):
            measurement = _validate(rr.Measurement, request.data)
            _, created = services.ingest_measurement(run, measurement)
        return Response({"ok": True, "created": created}, status=201 if created else 200)
