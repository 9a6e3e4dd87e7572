"""``GET /api/v1/runs/{public_id}/logs``: the tail of a run's runner log, from its executor.

Owner (or staff) only: a runner's log names paths, hosts and models that a public run's
readers need not see. Anonymous callers get 401, others 404 for a run they cannot see and
403 for a public run they can (as for cancel).

The log comes from ``portal.dispatch.runlog.log_tail``, the function the run page uses
too; reading it changes nothing. The answer is ``{"lines": str, "source": executor,
"note": str}``. ``lines`` may be empty
(no Pod yet, or the executor could not be reached: the executor never raises for logs);
then ``note`` says why when the executor knows, e.g. "waiting for a GPU: 0/4 nodes are
available: 4 Insufficient nvidia.com/gpu." for a Pod the scheduler cannot place.
"""

from __future__ import annotations

import logging

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import permissions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api.errors import ApiError
from portal.api.views import get_run_or_404
from portal.dispatch.runlog import DEFAULT_TAIL, MAX_TAIL, log_tail

log = logging.getLogger(__name__)


def _tail(request: Request) -> int:
    raw = request.query_params.get("tail", str(DEFAULT_TAIL))
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 6):
        raise ApiError(
            400,
            "invalid_parameter",
            f"tail must be a whole number of lines, not {raw[:40]!r}",
            [{"field": "tail", "message": "a whole number of lines"}],
        )
    tail = int(raw)
    if not 1 <= tail <= MAX_TAIL:
        raise ApiError(
            400,
            "invalid_parameter",
            f"tail must be between 1 and {MAX_TAIL}",
            [{"field": "tail", "message": f"between 1 and {MAX_TAIL}"}],
        )
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
        description="The tail of the runner's log (the run's owner only). Reads only.",
    )
    def get(self, request: Request, public_id: str) -> Response:
        run = get_run_or_404(request.user, public_id)
        tail = _tail(request)
        found = log_tail(request.user, run, tail)
        if found is None:
            raise ApiError(403, "forbidden", "only the run's owner can read its runner log")
        return Response(
            {"lines": found.text, "source": found.source, "note": found.note or found.error}
        )
