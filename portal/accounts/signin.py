"""Sign-in throttling: failed passwords counted per username and per client address, and
refused before the password hasher runs once either count reaches its limit.

The hasher is slow on purpose (PBKDF2: ~1.6 s of CPU on a busy 2-core machine), so
unthrottled guessing is both a password attack and a way to take the web workers' CPU.
Limits: ``SERVEBENCH_SIGNIN_FAILURES_PER_USERNAME`` (default 10 per 15 minutes) and
``SERVEBENCH_SIGNIN_FAILURES_PER_ADDRESS`` (default 50 per 15 minutes), counted in Redis
(``portal.ops.counters``) so every web process sees the same counts. A successful sign-in
clears its username's count (not its address's: one's own account must not reset an
address that guesses at others'). A refused username is refused for the rest of its
window whoever asks, which is the price of counting per username; the window is short.

- ``ThrottledModelBackend`` (``AUTHENTICATION_BACKENDS``): every password check (the
  sign-in page, the Django admin's) counts and is refused without hashing.
- ``SignInView``: the sign-in page answers a refused attempt with 429 and Retry-After,
  and says on the form when to try again.
- ``client_address(request)``: REMOTE_ADDR, or the X-Forwarded-For entry
  ``SERVEBENCH_PROXY_HOPS`` from the end when proxies stand in front.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.views import LoginView
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from portal.lib.rates import Rate
from portal.ops import counters


def client_address(request: HttpRequest) -> str:
    """The client's address: REMOTE_ADDR, or with SERVEBENCH_PROXY_HOPS proxies in front,
    the X-Forwarded-For entry they appended for it."""
    hops = settings.SERVEBENCH_PROXY_HOPS
    if hops:
        forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [a for a in forwarded if a]
        if len(forwarded) >= hops:
            return forwarded[-hops][:64]
    return str(request.META.get("REMOTE_ADDR", ""))[:64]


def _username_key(username: str) -> str:
    return hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]


def _checks(request: HttpRequest, username: str) -> list[tuple[str, str, Rate, str]]:
    """(scope, ident, limit, what) of each counted dimension that has a limit."""
    checks = []
    per_user = settings.SERVEBENCH_SIGNIN_FAILURES_PER_USERNAME
    per_address = settings.SERVEBENCH_SIGNIN_FAILURES_PER_ADDRESS
    if per_user is not None and username:
        checks.append(("signin-user", _username_key(username), per_user, "this username"))
    if per_address is not None:
        checks.append(("signin-addr", client_address(request), per_address, "your address"))
    return checks


@dataclass(frozen=True)
class Refusal:
    what: str  # "this username" or "your address"
    retry_after: int

    @property
    def message(self) -> str:
        minutes = (self.retry_after + 59) // 60
        return (
            f"Too many failed sign-ins for {self.what}. Try again in "
            f"{minutes} minute{'s' if minutes != 1 else ''}."
        )


def refused(request: HttpRequest, username: str) -> Refusal | None:
    """Why a sign-in for ``username`` from this client is refused now, or None."""
    for scope, ident, limit, what in _checks(request, username):
        window = counters.peek(scope, ident, limit.seconds)
        if window is not None and window.count >= limit.count:
            return Refusal(what, window.resets_in)
    return None


def record_failure(request: HttpRequest, username: str) -> None:
    for scope, ident, limit, _ in _checks(request, username):
        counters.hit(scope, ident, limit.seconds)


def record_success(request: HttpRequest, username: str) -> None:
    limit = settings.SERVEBENCH_SIGNIN_FAILURES_PER_USERNAME
    if limit is not None and username:
        counters.clear("signin-user", _username_key(username), limit.seconds)


class ThrottledModelBackend(ModelBackend):
    """Django's username/password backend, refused (without hashing) while throttled."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        name = str(username or kwargs.get("username") or "")
        if request is not None and refused(request, name) is not None:
            raise PermissionDenied("too many failed sign-ins")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if request is not None and password is not None:
            if user is None:
                record_failure(request, name)
            else:
                record_success(request, name)
        return user


class SignInView(LoginView):
    """The sign-in page: 429 with Retry-After while this username or address is refused."""

    template_name = "web/login.html"
    redirect_authenticated_user = True

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        refusal = refused(request, str(request.POST.get("username", ""))[:150])
        if refusal is None:
            return super().post(request, *args, **kwargs)
        # The form again, unbound: no password is checked.
        username = str(request.POST.get("username", ""))[:150]
        form = self.get_form_class()(request, initial={"username": username})
        context = self.get_context_data(form=form, throttled=refusal.message)
        response = self.render_to_response(context, status=429)
        response["Retry-After"] = str(refusal.retry_after)
        return response
