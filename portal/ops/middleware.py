"""``OpsMiddleware``, first in ``MIDDLEWARE``: answers ``/metrics`` (``portal.ops.metrics``)
and counts the 5xx answers of everything else.

``/metrics`` is answered here, before ``CommonMiddleware`` validates the Host header:
Prometheus scrapes each pod at its address, which ALLOWED_HOSTS does not (and should not)
list; the endpoint is guarded by its own token or networks instead. While /metrics is off
(no token, no networks) the request goes on and is answered 404 like any unknown path.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from portal.ops import counters, metrics

METRICS_PATHS = ("/metrics", "/metrics/")


class OpsMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path in METRICS_PATHS and metrics.enabled():
            return metrics.endpoint(request)
        response = self.get_response(request)
        if response.status_code >= 500:
            counters.add("http_5xx", str(response.status_code))
        return response
