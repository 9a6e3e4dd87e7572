"""Runner -> portal ingestion (docs/protocol.md), authenticated with the run's own token.

``POST /api/v1/runner/runs/{id}/events``        -> 200 {"ok": true, "run_status": ...}
``POST /api/v1/runner/runs/{id}/measurements``  -> 201 created | 200 already stored
``PUT  /api/v1/runner/runs/{id}/samples?backend=&point=&repeat=`` -> 201 (a large point's
     full per-request samples, gzip-compressed JSON streamed to storage before the
     measurement that names them: ``runners.samplesfile``)

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
from portal.benchmarks import ingestion, samplestore
from portal.benchmarks.models import Environment, Run
from portal.dispatch.executors import ExecutorError, get_executor
from portal.lib.logctx import bound_run
from portal.web import warm
from runners import result as rr
from runners.spec import errors_from


def _validate(model: type[BaseModel], data: Any) -> Any:
    """The body as ``model``; 400 naming the field for anything that does not validate
    (negative counts, non-finite numbers: ``runners.result``). What could not be stored or
    shown at all (NUL, lone surrogates, keys with control characters, duplicate keys,
    huge integers, deep nesting) was refused by the parser already
    (``portal.api.parsers``), for every endpoint alike."""
    if not isinstance(data, dict):
        raise ApiError(400, "invalid", "the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        fields = errors_from(exc)
        first = fields[0]
        raise ApiError(400, "invalid", f"{first['field']}: {first['message']}", fields) from None


def _executor_digest(run: Run) -> str:
    """The runner image's digest as the executor saw it (a Kubernetes Pod's ``imageID``);
    "" when it knows none (yet): a local executor, or a Pod whose status the kubelet has
    not written."""
    if not run.executor or not run.executor_handle:
        return ""
    try:
        return get_executor(run.executor).image_digest(run.executor_handle)
    except ExecutorError:
        return ""


def _stamped(environment: dict[str, Any], run: Run, digest: str) -> dict[str, Any]:
    environment = dict(environment)
    container = environment.get("container")
    container = dict(container) if isinstance(container, dict) else {}
    container.update(image_digest=digest, image_digest_source=f"{run.executor} executor")
    environment["container"] = container
    return environment


def _with_image_digest(run: Run, event: rr.Event) -> rr.Event:
    """The environment with the image digest the executor saw, which the runner cannot
    know from inside its container; unchanged when the executor knows none yet."""
    digest = _executor_digest(run)
    if not digest:
        return event
    stamped = _stamped(event.environment or {}, run, digest)
    return event.model_copy(update={"environment": stamped})


def _fill_image_digest(run: Run) -> None:
    """At the run's end, the digest the environment event could not have: the runner
    reports its environment as soon as its container starts, often before the kubelet has
    written the Pod's ``imageID`` (seconds later on a busy node). The Pod still runs when
    its runner reports the end, so its status has the digest by then."""
    env = Environment.objects.filter(run=run).first()
    if env is None or not isinstance(env.snapshot, dict):
        return
    container = env.snapshot.get("container")
    known = container.get("image_digest") if isinstance(container, dict) else None
    if known and str(known).startswith("sha256:"):
        return
    digest = _executor_digest(run)
    if digest:
        env.snapshot = _stamped(env.snapshot, run, digest)
        env.save(update_fields=["snapshot"])


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
            if event.type == "environment" and event.environment is not None:
                event = _with_image_digest(run, event)
            if event.type in ("finished", "failed"):
                _fill_image_digest(run)  # before the run ends: its pages show the digest
            status = ingestion.ingest_event(run, event)
            if event.type == "finished":
                warm.ended(run.pk)  # its pages (run, history, compare) for the first reader
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
            try:
                _, created = ingestion.ingest_measurement(run, measurement)
            except ingestion.StorageUnavailable as exc:
                raise ApiError(503, "storage_unavailable", str(exc)) from None
        return Response({"ok": True, "created": created}, status=201 if created else 200)


class RunnerSamples(RunnerView):
    """A large point's full per-request samples (``runners.samplesfile``), read from the
    request a chunk at a time and spooled to disk: never parsed, never held in memory."""

    @extend_schema(
        operation_id="runner_samples",
        request={"application/gzip": OpenApiTypes.BINARY},
        responses={201: OpenApiTypes.OBJECT},
        description=(
            "The full per-request arrays of one measurement (gzip-compressed JSON), before "
            "the measurement that names them in samples_full; query: backend, point, repeat; "
            "header X-Content-SHA256. Idempotent: a retry replaces the upload."
        ),
    )
    def put(self, request: Request, public_id: str) -> Response:
        run = self.run_for(request, public_id)
        query = request.query_params
        backend, point = query.get("backend", ""), query.get("point", "")
        for field, value in (("backend", backend), ("point", point)):
            if not value:
                raise ApiError(400, "invalid", f"{field}: required (the measurement's {field})")
        try:
            repeat = int(query.get("repeat", ""))
        except ValueError:
            raise ApiError(400, "invalid", "repeat: required, a whole number") from None
        sha256 = request.headers.get("X-Content-SHA256", "").strip().lower()
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ApiError(400, "invalid", "X-Content-SHA256: required, the body's SHA-256 in hex")
        raw_length = request.META.get("CONTENT_LENGTH") or ""
        if not raw_length.isdigit() or int(raw_length) == 0:
            raise ApiError(411, "length_required", "Content-Length: required, the body's size")
        if request.content_type != "application/gzip":
            raise ApiError(415, "unsupported_media_type", "Content-Type: send application/gzip")
        with bound_run(run.public_id):
            try:
                size = ingestion.ingest_samples(
                    run, backend, point, repeat, request._request, int(raw_length), sha256
                )
            except samplestore.UploadRefused as exc:
                code = "too_large" if exc.status == 413 else "invalid"
                raise ApiError(exc.status, code, str(exc)) from None
            except ingestion.StorageUnavailable as exc:
                raise ApiError(503, "storage_unavailable", str(exc)) from None
        return Response({"ok": True, "bytes": size}, status=201)
