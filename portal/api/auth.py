"""Bearer-token authentication for the API (``sb_ci_``) and the runner endpoints (``sb_run_``).

A CI token acts as its user on the REST API. A run token authenticates only on its run's
ingestion endpoints (``RunTokenAuthentication``); the views check the run matches.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from portal.accounts.models import ApiToken
from portal.accounts.tokens import verify_token


def _bearer(request: Request) -> str | None:
    header = authentication.get_authorization_header(request).decode("latin-1")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        # 'Token ...' (DRF's habit) or 'Basic ...' would otherwise pass as anonymous and
        # read only public runs, which looks like a permissions bug to the caller.
        raise exceptions.AuthenticationFailed(
            f"the Authorization scheme {scheme[:20]!r} is not supported here; send "
            "'Authorization: Bearer <token>'."
        )
    value = value.strip()
    if not value or " " in value:
        raise exceptions.AuthenticationFailed("malformed Authorization header.")
    return value


def _verified(request: Request, refused: str) -> ApiToken | None:
    """The active token the request carries; None without one, 401 (``refused``) if bad."""
    plaintext = _bearer(request)
    if plaintext is None:
        return None
    token = verify_token(plaintext)
    if token is None:
        raise exceptions.AuthenticationFailed(refused)
    return token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer sb_ci_...``: the token's user, for the REST API."""

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        token = _verified(request, "invalid, expired or revoked token.")
        if token is None:
            return None
        if token.kind != ApiToken.Kind.CI:
            raise exceptions.AuthenticationFailed(
                "a run token (sb_run_) only writes to its own run's runner endpoints."
            )
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="servebench"'


class RunTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer sb_run_...``: the runner of one run (``request.auth.run_id``)."""

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        token = _verified(request, "invalid, expired or revoked run token.")
        if token is None:
            return None
        if token.kind != ApiToken.Kind.RUN or token.run_id is None:
            raise exceptions.AuthenticationFailed(
                "runner endpoints take the run's own token (sb_run_...), not a user token."
            )
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="servebench-runner"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = BearerTokenAuthentication
    name = "ciToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A CI/API token, `sb_ci_...` (manage.py createtoken USER).",
        }


class RunTokenScheme(OpenApiAuthenticationExtension):
    target_class = RunTokenAuthentication
    name = "runToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "The run-scoped token the runner gets, `sb_run_...`.",
        }
