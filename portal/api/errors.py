"""One error shape for the whole API, and the exception handler that produces it.

    {"error": {"code": "invalid_spec",
               "message": "spec.workload.input_len: Input should be greater than or equal to 1",
               "field": "spec.workload.input_len",
               "fields": [{"field": "spec.workload.input_len", "message": "..."}]}}

``field`` is the first offending field (absent when the error is not about one), ``fields``
all of them. Bad input is always a 4xx; the message says what to do next. A body that
does not parse, or holds a value no field accepts (``portal.api.parsers.BodyRefused``:
NaN, a lone surrogate, a duplicated key...), is ``malformed_body``, with its field when
one is at fault. Every text that echoes input is made encodable first (a lone surrogate
in a key would otherwise fail to render the very 400 that names it).
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, JsonResponse
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import set_rollback

from portal.accounts.quotas import QuotaExceeded
from portal.api.parsers import BodyRefused
from portal.benchmarks.ingestion import IngestRefused
from portal.benchmarks.lifecycle import RunFinished
from portal.benchmarks.policy import SpecForbidden
from portal.benchmarks.queries import FilterError
from portal.ops import counters
from portal.ops.metrics import refusal_label
from runners import spec as rs
from runners.spec import renderable

log = logging.getLogger(__name__)


class ApiError(exceptions.APIException):
    """An error with an explicit code, status and optional field list."""

    def __init__(
        self,
        status_code: int,
        code: str,
        message: str,
        fields: list[dict[str, str]] | None = None,
        **extra: Any,
    ):
        self.status_code = status_code
        self.code = code
        self.message = message
        self.fields = fields or []
        self.extra = extra
        super().__init__(message, code)


def error_body(
    code: str, message: str, fields: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """The error shape, every text in it encodable (``renderable``)."""
    fields = [{k: renderable(str(v)) for k, v in f.items()} for f in fields or []]
    body: dict[str, Any] = {"code": code, "message": renderable(message)}
    if fields:
        body["field"] = fields[0]["field"]
        body["fields"] = fields
    return {"error": body}


def _flatten(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    if isinstance(detail, dict):
        out = []
        for key, value in detail.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            out.extend(_flatten(value, "" if key == "non_field_errors" else name))
        return out
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            return [{"field": prefix, "message": str(item)} for item in detail]
        out = []
        for i, item in enumerate(detail):
            out.extend(_flatten(item, f"{prefix}.{i}" if prefix else str(i)))
        return out
    return [{"field": prefix, "message": str(detail)}]


_AUTH_HINT = (
    "Send 'Authorization: Bearer sb_ci_...' (create a token on the API tokens page or with "
    "`manage.py createtoken USER`), or sign in."
)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every known error becomes the JSON shape above."""
    headers: dict[str, str] = {}
    extra: dict[str, Any] = {}
    if isinstance(exc, QuotaExceeded):
        code, status_code, message = "quota_exceeded", exc.status, str(exc)
        fields = [{"field": exc.field, "message": message}] if exc.field else []
        extra["quota"] = exc.as_dict()
        if exc.retry_after() is not None:
            headers["Retry-After"] = str(exc.retry_after())
    elif isinstance(exc, SpecForbidden):
        code, status_code, fields, message = "forbidden_field", 403, exc.errors, str(exc)
    elif isinstance(exc, rs.SpecError):
        code, status_code, fields = "invalid_spec", 400, exc.errors
        message = str(exc)
        if not fields[0]["field"]:
            fields = []
    elif isinstance(exc, IngestRefused):
        code, status_code = "refused", 400
        message = f"{exc.field}: {exc}"
        fields = [{"field": exc.field, "message": str(exc)}]
    elif isinstance(exc, FilterError):
        code, status_code, message = "invalid_filter", 400, str(exc)
        fields = [{"field": exc.field, "message": str(exc)}]
    elif isinstance(exc, RunFinished):
        code, status_code, message, fields = "run_finished", 409, str(exc), []
        extra["run_status"] = exc.run.status
    elif isinstance(exc, ApiError):
        code, status_code, message, fields = exc.code, exc.status_code, exc.message, exc.fields
        extra.update(exc.extra)
    elif isinstance(exc, Http404 | exceptions.NotFound):
        code, status_code, fields = "not_found", 404, []
        message = "not found (or not visible to you); check the id and that you are signed in"
    elif isinstance(exc, exceptions.NotAuthenticated):
        code, status_code, fields = "not_authenticated", 401, []
        message = f"authentication required. {_AUTH_HINT}"
    elif isinstance(exc, exceptions.AuthenticationFailed):
        code, status_code, fields = "invalid_token", 401, []
        message = f"{exc.detail} {_AUTH_HINT}"
    elif isinstance(exc, exceptions.PermissionDenied | DjangoPermissionDenied):
        code, status_code, fields = "forbidden", 403, []
        message = str(getattr(exc, "detail", "")) or "you may not do this"
    elif isinstance(exc, BodyRefused):
        code, status_code = "malformed_body", 400
        fields = [{"field": exc.field, "message": exc.message}] if exc.field else []
        message = str(exc)
    elif isinstance(exc, exceptions.ParseError):
        code, status_code, fields = "malformed_body", 400, []
        message = f"{exc.detail}. Send a JSON object (Content-Type: application/json)."
    elif isinstance(exc, exceptions.ValidationError):
        code, status_code = "invalid", 400
        fields = _flatten(exc.detail)
        message = (
            f"{fields[0]['field']}: {fields[0]['message']}"
            if fields and fields[0]["field"]
            else (fields[0]["message"] if fields else "invalid input")
        )
    elif isinstance(exc, exceptions.APIException):
        status_code = exc.status_code
        code = exc.default_code if isinstance(exc.default_code, str) else "error"
        message, fields = str(exc.detail), []
        if isinstance(exc, exceptions.Throttled) and exc.wait:
            headers["Retry-After"] = str(int(exc.wait))
    else:
        return None  # a bug: let Django log it and answer 500
    if status_code == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="servebench"'
    set_rollback()
    if status_code == 400 and "/runner/" in getattr(context.get("request"), "path", ""):
        # A runner report refused (/metrics: servebench_ingestion_refusals_total).
        counters.add("ingestion_refusals", refusal_label(fields[0]["field"] if fields else ""))
    body = error_body(code, message, fields)
    body.update(extra)
    return Response(body, status=status_code, headers=headers)


def json_error(status_code: int, code: str, message: str) -> JsonResponse:
    """The same shape outside DRF (404/500 handlers, plain views)."""
    return JsonResponse(error_body(code, message), status=status_code)
