"""Where the runner's HTTP requests may go: one rule for every outbound call.

A run reaches only what it names: the endpoints of its spec (whose hosts the portal's
policy allowed at submit, SERVEBENCH_ENDPOINT_HOSTS), the servers the runner started
itself on loopback (vLLM, ``transformers serve``), and the portal it reports to. Every
client is pinned to the origin (scheme, host, port) of its target, checked against that
list, and follows no redirect: a 3xx answer is an ``EgressRefused`` that names the
target, the status and the host the ``Location`` points at, and says what to do (point
``base_url`` at the final URL). So an allow-listed endpoint that answers with a redirect
cannot make the runner send a request, a key or a load anywhere else, the portal
included: nothing is sent to the redirect's target.

The clients:

- ``Session`` (``requests``): the endpoint probes and facts (``runners.endpoint``), the
  ``/metrics`` scraper (``runners.server_metrics``), the servers' health checks
  (``runners.vllm_server``), a point's request probe (``runners.vllm_bench``), and the
  reporter (``runners.report``). ``EgressRefused`` is a ``requests.RequestException``,
  so each caller's handling of an unreachable target applies, with this message.
- vLLM's bench client (``aiohttp``, in its own process): ``runners.bench_client``
  applies ``check`` and ``redirect_refused`` to every request of that process and
  follows no redirect.
- The sampler's kept-alive ``http.client`` connection (``runners.server_metrics``):
  it connects to its target's origin only and never follows a redirect.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

import requests

if TYPE_CHECKING:
    from runners.spec import Spec

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
FIX_BASE_URL = "point base_url at the final URL (where the redirect leads), if that host is allowed"
FIX_REPORT_URL = "point --report at the portal's final URL"

Origin = tuple[str, str, int]


def origin(url: str) -> Origin | None:
    """(scheme, host, port) of an http(s) URL, the host lowercased and the port filled in;
    None when ``url`` is not one."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is not a number, a malformed IPv6 address
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        return None
    return scheme, host, port or (443 if scheme == "https" else 80)


def _shown(origin_: Origin) -> str:
    scheme, host, port = origin_
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


class EgressRefused(requests.RequestException):
    """A request the rule does not allow: to an origin off the list, or the answer was a
    redirect (``status`` and ``location`` then say which). Nothing was sent there."""

    def __init__(self, message: str, *, status: int | None = None, location: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.location = location


class Egress:
    """The origins one client may reach (``label`` names them in messages, ``fix`` says what
    to do about a redirect)."""

    def __init__(self, urls: Iterable[str], label: str, fix: str = FIX_BASE_URL) -> None:
        self.origins: frozenset[Origin] = frozenset(o for u in urls if (o := origin(u)))
        self.label = label
        self.fix = fix

    # ------------------------------------------------------------------ the lists

    @classmethod
    def for_spec(cls, spec: Spec) -> Egress:
        """The spec's endpoints (the portal's policy allowed their hosts at submit)."""
        names = ", ".join(repr(b.name) for b in spec.endpoint_backends) or "none"
        return cls((b.base_url for b in spec.endpoint_backends), f"the spec's endpoints ({names})")

    @classmethod
    def local_server(cls, base_url: str, label: str) -> Egress:
        """A server the runner started itself: on loopback, or a programming error."""
        found = origin(base_url)
        if found is None or found[1] not in LOOPBACK_HOSTS:
            raise ValueError(f"{label} is not on loopback: {base_url!r}")
        return cls([base_url], label, "the runner's own server must not redirect")

    @classmethod
    def portal(cls, url: str) -> Egress:
        """The portal the runner reports to (``--report``)."""
        return cls([url], "the portal", FIX_REPORT_URL)

    def pinned(self, base_url: str, label: str | None = None) -> Egress:
        """Only ``base_url``'s origin, which must be on this list (an endpoint of the spec):
        the client of one target."""
        self.check("GET", base_url)
        return Egress([base_url], label or self.label, self.fix)

    # ------------------------------------------------------------------ the rule

    def allows(self, url: str) -> bool:
        found = origin(url)
        return found is not None and found in self.origins

    def check(self, method: str, url: str) -> None:
        """EgressRefused unless ``url``'s origin is on the list."""
        if self.allows(url):
            return
        allowed = ", ".join(sorted(_shown(o) for o in self.origins)) or "none"
        raise EgressRefused(
            f"{method} {url[:200]} is not a request {self.label} may be sent: the runner "
            f"reaches only its spec's endpoints, the servers it started and its portal "
            f"(allowed here: {allowed})"
        )

    def redirect_refused(
        self, method: str, url: str, status: int, location: str | None
    ) -> EgressRefused:
        """The error for a redirect answer to ``method url``: it names the target, the
        status and the host the Location points at, and what to do."""
        path = urlsplit(url).path or "/"
        if location:
            target = urljoin(url, location)
            host = urlsplit(target).hostname or "?"
            where = f"a redirect to host {host!r} ({target[:200]})"
        else:
            where = "a redirect without a Location"
        return EgressRefused(
            f"{self.label} answered {method} {path} with {status}, {where}; the runner "
            f"follows no redirects, so nothing was sent there: {self.fix}",
            status=status,
            location=location or "",
        )

    def session(self) -> Session:
        return Session(self)


class Session(requests.Session):
    """A ``requests`` session bound to an ``Egress``: every request is checked against it
    before anything is sent, and a redirect answer raises ``EgressRefused`` instead of
    being followed (whatever ``allow_redirects`` a caller passes)."""

    def __init__(self, egress: Egress) -> None:
        super().__init__()
        self.egress = egress

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        method, url = request.method or "GET", request.url or ""
        self.egress.check(method, url)
        kwargs["allow_redirects"] = False
        response = super().send(request, **kwargs)
        if response.status_code in REDIRECT_STATUSES:
            location = response.headers.get("Location")
            response.close()
            raise self.egress.redirect_refused(method, url, response.status_code, location)
        return response


def pinned_session(base_url: str, label: str, fix: str = FIX_BASE_URL) -> Session:
    """A session that may reach ``base_url``'s origin only (the client of one target the
    caller was handed: a server's URL, an endpoint the spec names)."""
    return Egress([base_url], label, fix).session()
