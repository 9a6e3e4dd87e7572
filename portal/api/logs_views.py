"""``GET /api/v1/runs/{public_id}/logs``: the tail of a run's runner log, from its executor.

Owner (or staff) only: a runner's log names paths, hosts and models that a public run's
readers need not see. Anonymous callers get 401, others 404 for a run they cannot see and
403 for a public run they can (as for cancel).

The answer is ``{"lines": str, "source": executor, "note": str}``. ``lines`` may be empty
(no Pod yet, or the executor could not be reached: the executor never raises for logs);
then ``note`` says why when the executor knows, e.g. "waiting for a GPU: 0/4 nodes are
available: 4 Insufficient nvidia.com/gpu." for a Pod the scheduler cannot place.
"""

from __future__ import annotations

import logging
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.errors import ApiError
from portal.api.views import get_run_or_404
from portal.benchmarks.models import Run
from portal.dispatch.executors import ExecutorError, get_executor

log = logging.getLogger(__name__)

DEFAULT_TAIL = 100
MAX_TAIL = 2000


def can_read_logs(user: Any, run: Run) -> bool:
    return bool(user.is_authenticated and (run.owner_id == user.pk or user.is_staff))


def _tail(request: Request) -> int:
    raw = request.query_params.get("tail", str(DEFAULT_TAIL))
    try:
        tail = int(raw)
    except ValueError:
        raise ApiError(
            400, "invalid_parameter", f"tail must be a whole number of lines, not {raw!r}"
        ) from None
    if not 1 <= tail <= MAX_TAIL:
        raise ApiError(400, "invalid_parameter", f"tail must be between 1 and {MAX_TAIL}")
    return tail


class RunLogs(APIView):
    permission_classes = [permissions.IsAuthenticated]

    @extend_schema(
        operation_id="runs_logs",
        parameters=[
            OpenApiParameter(
                "tail", int, description=f"Lines from the end (1..{MAX_TAIL}, {DEFAULT_TAIL})."
            )
        ],
        responses=inline_serializer(
            "RunLogs",
            {
                "lines": serializers.CharField(help_text="The last lines, newline-separated."),
                "source": serializers.CharField(help_text="The executor: local, kubernetes."),
                "note": serializers.CharField(help_text="Why there are no lines, if known."),
            },
        ),
        description="The tail of the runner's log (the run's owner only).",
    )
    def get(self, request: Request, public_id: str) -> Response:
        run = get_run_or_404(request.user, public_id)
        if not can_read_logs(request.user, run):
            raise ApiError(403, "forbidden", "only the run's owner can read its runner log")
        tail = _tail(request)
        if not run.executor_handle:
            note = (
                "the run has not been submitted to an executor yet"
                if not run.is_final
                else "the run never reached an executor"
            )
            return Response({"lines": "", "source": run.executor, "note": note})
        try:
            executor = get_executor(run.executor or None)
        except ExecutorError as exc:
            return Response({"lines": "", "source": run.executor, "note": str(exc)})
        lines = executor.logs(run.executor_handle, tail=tail)
        note = ""
        if not lines and not run.is_final:
            try:
                note = executor.status(run.executor_handle).reason
            except ExecutorError as exc:  # unreachable: say so instead of failing the page
                note = str(exc)
        return Response({"lines": lines, "source": executor.name, "note": note})
