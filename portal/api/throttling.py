"""API rate limits (DRF throttles, ``REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]``).

Each request counts against one scope, chosen by who asks, in a fixed window shared by
every web process (``portal.ops.counters``, Redis):

========  =================================  ==============================
scope     who                                counted per
========  =================================  ==============================
anon      no token, not signed in (reads)    client address
user      signed in (the web's session)      user
ci        a CI token (``sb_ci_``)            user (all their tokens)
runner    a run token (``sb_run_``)          run
submit    ``POST /api/v1/runs/`` besides      user
========  =================================  ==============================

Rates are ``settings.SERVEBENCH_RATES`` (``SERVEBENCH_RATE_<SCOPE>``; None: no limit). Over
a limit the answer is 429 with ``Retry-After`` (seconds to the window's end) and a message
naming the limit. When Redis does not answer, requests pass: an outage costs the limits,
not the API.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework.exceptions import Throttled
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from portal.accounts.models import ApiToken
from portal.accounts.signin import client_address
from portal.ops import counters

_WHAT = {
    "anon": "requests without a token from your address",
    "user": "requests of your signed-in session",
    "ci": "requests with your API tokens",
    "runner": "runner reports of this run",
    "submit": "run submissions",
}


def scope_of(request: Request) -> tuple[str, str]:
    """(scope, identity) the request counts against."""
    auth = request.auth
    if isinstance(auth, ApiToken):
        if auth.kind == ApiToken.Kind.RUN:
            return "runner", f"run-{auth.run_id}"
        return "ci", f"user-{auth.user_id}"
    if request.user.is_authenticated:
        return "user", f"user-{request.user.pk}"
    return "anon", client_address(request._request)


def _count(scope: str, ident: str) -> bool:
    rate = settings.SERVEBENCH_RATES.get(scope)
    if rate is None:
        return True
    window = counters.hit(scope, ident, rate.seconds)
    if window is None or window.count <= rate.count:
        return True
    raise Throttled(
        wait=window.resets_in,
        detail=(
            f"rate limit reached: {rate} {_WHAT[scope]} (SERVEBENCH_RATE_{scope.upper()}); "
            f"try again in {window.resets_in} s"
        ),
    )


class ScopedRateThrottle(BaseThrottle):
    """Every API request: its scope's rate (``scope_of``)."""

    def allow_request(self, request: Request, view: Any) -> bool:
        return _count(*scope_of(request))


class SubmitRateThrottle(BaseThrottle):
    """Run submissions (``POST /api/v1/runs/``), per user, besides their scope's rate."""

    def allow_request(self, request: Request, view: Any) -> bool:
        match = getattr(request._request, "resolver_match", None)
        if request.method != "POST" or match is None or match.view_name != "api:runs":
            return True
        if not request.user.is_authenticated:
            return True  # refused with 401 before any run is made
        return _count("submit", f"user-{request.user.pk}")
