"""Request hygiene and security headers for every response (first middleware after
Django's SecurityMiddleware).

- A path, query parameter or form field holding a NUL or another control character (C0,
  DEL, C1) or a bidirectional override is answered 400 naming it, before any view:
  PostgreSQL cannot compare or store NUL, so such a value would otherwise surface as a
  server error deep in a query, and a CR or an override would be accepted and shown
  wrong. A form field may hold tabs and line breaks (a textarea's), a query parameter no
  control character at all.
- Every response gets the Content-Security-Policy of settings
  (SERVEBENCH_CONTENT_SECURITY_POLICY: scripts from this origin only, no inline script)
  unless the view set its own, and ``X-Frame-Options: DENY`` comes from Django.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from runners.spec.common import shown

# Bidirectional embeddings, overrides and isolates (text shown in another order than
# it is stored), then controls: a form's fields may carry tab, newline and carriage
# return (a textarea's), a query parameter or a path none.
_BIDI = "\u202a-\u202e\u2066-\u2069"
_BAD = re.compile(f"[\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f-\\x9f{_BIDI}]")
_BAD_IN_QUERY = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_BIDI}]")
_BAD_IN_PATH = re.compile(r"[\x00-\x1f\x7f]")


def bad_input(request: HttpRequest) -> tuple[str, str] | None:
    """(where, message) for the first control character in the request's path, query
    or url-encoded form; None when it has none."""
    if _BAD_IN_PATH.search(request.path_info):
        return "path", "the URL path contains a control character (e.g. %00)"
    for source, params, bad in (
        ("query", request.GET, _BAD_IN_QUERY),
        ("form", _form(request), _BAD),
    ):
        if params is None:
            continue
        for key, values in params.lists():
            if _BAD_IN_QUERY.search(key):
                return shown(key, 64), f"a {source} parameter name contains a control character"
            if any(bad.search(v) for v in values if isinstance(v, str)):
                return key[:64], (
                    f"the {source} parameter {key[:64]!r} contains a control character or a "
                    "bidirectional override"
                )
    return None


def _form(request: HttpRequest) -> object | None:
    content_type = request.META.get("CONTENT_TYPE", "")
    if request.method == "POST" and content_type.startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        return request.POST
    return None


class SecurityHeadersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.csp = settings.SERVEBENCH_CONTENT_SECURITY_POLICY

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = bad_input(request)
        if problem is not None:
            response = self._refuse(request, *problem)
        else:
            response = self.get_response(request)
        if self.csp and "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = self.csp
        return response

    @staticmethod
    def _refuse(request: HttpRequest, field: str, message: str) -> HttpResponse:
        if request.path_info.startswith("/api/"):
            body = {
                "error": {
                    "code": "invalid_parameter",
                    "message": f"{message}; remove it",
                    "field": field,
                    "fields": [{"field": field, "message": message}],
                }
            }
            return JsonResponse(body, status=400)
        return HttpResponseBadRequest(
            f"Bad request: {message}; remove it.", content_type="text/plain; charset=utf-8"
        )
