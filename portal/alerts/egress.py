"""Where alert webhooks may go, and the one function that sends to them.

A webhook is an outbound request the portal makes on a user's behalf, from inside the
deployment, like an endpoint backend's: the same kind of admin allow-list decides.

1. **The URL** (``check_url``): ``http`` or ``https``, no user info, no control
   characters; its host and port must match ``SERVEBENCH_WEBHOOK_HOSTS`` by the rule of
   ``SERVEBENCH_ENDPOINT_HOSTS`` (``portal.benchmarks.policy.host_allowed``: exact names,
   ``*.domain``, optional ``:port``). A separate list: hosts a runner may load-test and
   hosts the portal may notify are different sets (``hooks.slack.com`` is no endpoint).
2. **The addresses** (``resolve``): the host is resolved and *every* address must be a
   global one: private (10/8, 172.16/12, 192.168/16, fc00::/7), loopback, link-local
   (169.254/16: cloud metadata), shared (100.64/10), multicast, reserved and unspecified
   addresses are refused unless ``SERVEBENCH_WEBHOOK_ALLOW_PRIVATE`` is on. One private
   answer among public ones is refused too: the client could pick it.
3. **The request** (``post``) connects to the address that was checked (not to the name
   again: a second lookup could answer differently), sends the name as Host and, for
   https, as SNI and the certificate's expected name; it never follows a redirect (a 3xx
   is a failed delivery: the new location was never checked) and has a timeout.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import urllib3
from django.conf import settings

from portal.benchmarks.policy import host_allowed


class Refused(Exception):
    """The destination is not allowed (permanent: retrying will not help)."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # lower-case name or address, IPv6 without brackets
    port: int
    path: str  # path and query

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


def check_url(url: str) -> Target:
    """The webhook URL's parts if the allow-list admits it; Refused saying why."""
    if not isinstance(url, str) or len(url) > 500:
        raise Refused("give an http(s) URL of at most 500 characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url) or not url.isascii():
        raise Refused("the URL holds spaces, control or non-ASCII characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused("the URL must start with http:// or https:// and name a host")
    if parts.username is not None or parts.password is not None:
        raise Refused("the URL must not carry a user name or password")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise Refused("the URL's port is not a number from 1 to 65535") from None
    host = parts.hostname.lower()
    allowed = list(settings.SERVEBENCH_WEBHOOK_HOSTS)
    shown = f"[{host}]" if ":" in host else host
    if not host_allowed(shown, str(port), allowed):
        hosts = ", ".join(allowed) or "none"
        raise Refused(
            f"webhook host {shown!r} (port {port}) is not one alerts may reach on this portal "
            f"(allowed: {hosts}; SERVEBENCH_WEBHOOK_HOSTS); ask an admin to add it"
        )
    literal = _address(host)
    if literal is not None:
        _check_address(literal, host)
    path = parts.path or "/"
    return Target(parts.scheme, host, port, path + (f"?{parts.query}" if parts.query else ""))


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _check_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address, host: str) -> None:
    mapped = getattr(address, "ipv4_mapped", None)
    address = mapped or address
    if address.is_global and not address.is_multicast:
        return
    if settings.SERVEBENCH_WEBHOOK_ALLOW_PRIVATE:
        return
    raise Refused(
        f"{host} resolves to {address}, an internal address (private, loopback, link-local "
        "or reserved); alerts go to public hosts only (SERVEBENCH_WEBHOOK_ALLOW_PRIVATE)"
    )


def resolve(target: Target) -> str:
    """The address to connect to: every address the host has must be allowed."""
    literal = _address(target.host)
    if literal is not None:
        _check_address(literal, target.host)
        return str(literal)
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise OSError(f"cannot resolve {target.host}: {exc}") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not addresses:
        raise OSError(f"{target.host} has no address")
    for text in addresses:
        _check_address(ipaddress.ip_address(text.split("%")[0]), target.host)
    return addresses[0]


@dataclass(frozen=True)
class Answer:
    status: int
    body: str


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
    """POST ``body`` to ``url`` at its checked address; Refused for a destination that is
    not allowed, OSError / urllib3's errors for one that did not answer. Redirects are
    answers, never followed."""
    target = check_url(url)
    address = resolve(target)
    pool_class = (
        urllib3.HTTPSConnectionPool if target.scheme == "https" else urllib3.HTTPConnectionPool
    )
    options: dict = {}
    if target.scheme == "https":
        options = {
            "server_hostname": target.host,
            "assert_hostname": target.host,
            "cert_reqs": "CERT_REQUIRED",
        }
    pool = pool_class(
        address,
        target.port,
        timeout=urllib3.Timeout(connect=timeout, read=timeout),
        retries=False,
        maxsize=1,
        **options,
    )
    try:
        response = pool.urlopen(
            "POST",
            target.path,
            body=body,
            headers={**headers, "Host": target.host_header},
            redirect=False,
            retries=False,
            preload_content=False,
            assert_same_host=False,
        )
        try:
            text = response.read(2048, decode_content=True).decode("utf-8", "replace")
        finally:
            response.release_conn()
        return Answer(response.status, text)
    finally:
        pool.close()
