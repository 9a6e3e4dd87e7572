"""HTTP client of the servebench REST API (``/api/v1/``), for the CLI and for scripts.

Every failure becomes a ``ServebenchError`` whose message is one line a person in a CI log
can act on: which server, what it said, and what to change (the token, the URL, the spec
field). Transient failures (connection refused, 502/503/504) are ``TransientError`` so a
long wait can ride them out. A 429 (a rate limit or fair-use quota) is waited out when its
``Retry-After`` fits in ``SERVEBENCH_RETRY_WAIT_S`` seconds (default 120, in all, per call;
0 never waits), saying so on stderr: the portal refused the call before doing anything, so
the same call is safe to send again. Nothing else is retried behind the caller's back.

Talks HTTP only; never imports Django (see DESIGN.md).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlsplit

import requests

from servebench import __version__

DEFAULT_TIMEOUT = 30.0
DEFAULT_RETRY_WAIT_S = 120.0
CREDENTIALS_HELP = (
    "set SERVEBENCH_TOKEN (or --token) to a CI token, sb_ci_..., from the portal's "
    "API tokens page or `manage.py createtoken USER`"
)


class ServebenchError(Exception):
    """An error the CLI reports in one line and exits 2 for."""


class TransientError(ServebenchError):
    """The portal could not be reached or answered 502/503/504: worth another try later."""


class ApiError(ServebenchError):
    """The portal answered with an error: HTTP ``status``, the API's ``code`` and ``field``."""

    def __init__(self, message: str, status: int, code: str = "", field: str = ""):
        super().__init__(message)
        self.status = status
        self.code = code
        self.field = field


def base_url_from(value: str | None) -> str:
    """The portal's root URL from --url / SERVEBENCH_URL, normalised (no trailing slash)."""
    url = (value or "").strip()
    if not url:
        raise ServebenchError(
            "no portal URL: set SERVEBENCH_URL (e.g. https://servebench.example.com) or pass --url"
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ServebenchError(
            f"portal URL {url!r} is not an http(s) URL; set SERVEBENCH_URL to the portal's "
            "root, e.g. https://servebench.example.com"
        )
    path = parts.path.rstrip("/")
    for suffix in ("/api/v1", "/api"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
    return f"{parts.scheme}://{parts.netloc}{path}"


class Client:
    """A session against one portal. ``token`` may be None for public, read-only use."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry_wait_s: float | None = None,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        self.base_url = base_url_from(base_url)
        self.timeout = timeout
        self.retry_wait_s = _retry_wait(retry_wait_s)
        self.notify = notify or _to_stderr
        self.session = requests.Session()
        self.session.headers["User-Agent"] = f"servebench-cli/{__version__}"
        self.session.headers["Accept"] = "application/json"
        if token:
            self.session.headers["Authorization"] = f"Bearer {token.strip()}"

    @classmethod
    def from_env(cls, url: str | None = None, token: str | None = None) -> Client:
        """Flags first, then SERVEBENCH_URL / SERVEBENCH_TOKEN."""
        return cls(
            url or os.environ.get("SERVEBENCH_URL", ""),
            token or os.environ.get("SERVEBENCH_TOKEN") or None,
        )

    # ------------------------------------------------------------------ transport

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: Any = None,
        expect_body: bool = True,
    ) -> Any:
        """One API call; the decoded JSON body (None for 204). Raises ServebenchError.
        A 429 is sent again after its Retry-After while the wait budget lasts."""
        waited = 0.0
        while True:
            response = self._send(method, path, params=params, json=json)
            wait = _retry_after(response) if response.status_code == 429 else None
            if wait is None or waited + wait > self.retry_wait_s:
                break
            body = _json(response)
            error = body.get("error") if isinstance(body, dict) else None
            why = str(error.get("message") or "") if isinstance(error, dict) else ""
            self.notify(
                f"servebench: the portal asks to wait {wait:.0f} s ({why or 'rate limit'}); "
                f"waiting, then sending {method} /api/v1/{path.lstrip('/')} again"
            )
            time.sleep(wait)
            waited += wait
        return self._answer(method, path, response, expect_body)

    def _send(
        self, method: str, path: str, *, params: dict[str, str] | None, json: Any
    ) -> requests.Response:
        url = f"{self.base_url}/api/v1/{path.lstrip('/')}"
        try:
            response = self.session.request(
                method, url, params=params, json=json, timeout=self.timeout
            )
        except requests.Timeout:
            raise TransientError(
                f"the portal at {self.base_url} did not answer within {self.timeout:.0f} s "
                f"({method} {path}); check that it is up, or try again"
            ) from None
        except requests.ConnectionError as exc:
            raise TransientError(
                f"cannot reach the servebench portal at {self.base_url} "
                f"({_reason(exc)}); check SERVEBENCH_URL (or --url) and that the portal is up"
            ) from None
        except requests.RequestException as exc:
            raise ServebenchError(
                f"request to {self.base_url} failed: {exc.__class__.__name__}: {exc}"
            ) from None
        return response

    def _answer(
        self, method: str, path: str, response: requests.Response, expect_body: bool
    ) -> Any:
        url = f"{self.base_url}/api/v1/{path.lstrip('/')}"
        if response.status_code == 204 or (not expect_body and response.ok):
            return None
        body = _json(response)
        if response.ok:
            if body is None:
                raise ServebenchError(
                    f"{url} answered HTTP {response.status_code} with "
                    f"{response.headers.get('Content-Type', 'no content type')}, not the "
                    "servebench API; check that SERVEBENCH_URL is the portal's root URL"
                )
            return body
        raise _api_error(self.base_url, method, path, response, body)

    def get(self, path: str, **params: str) -> Any:
        clean = {k: v for k, v in params.items() if v not in (None, "")}
        return self.request("GET", path, params=clean or None)

    # ------------------------------------------------------------------ endpoints

    def submit(
        self,
        spec_text: str | None = None,
        *,
        preset: str | None = None,
        name: str | None = None,
        public: bool = False,
    ) -> dict[str, Any]:
        """POST /runs/: the spec as YAML/JSON text (validated by the portal) or a preset."""
        body: dict[str, Any] = {"preset": preset} if preset else {"spec": spec_text}
        if name:
            body["name"] = name
        if public:
            body["is_public"] = True
        return self.request("POST", "runs/", json=body)

    def run(self, run_id: str) -> dict[str, Any]:
        return self.get(f"runs/{_seg(run_id)}/")

    def result(self, run_id: str) -> dict[str, Any]:
        return self.get(f"runs/{_seg(run_id)}/result")

    def cancel(self, run_id: str) -> dict[str, Any]:
        return self.request("POST", f"runs/{_seg(run_id)}/cancel")

    def presets(self) -> list[dict[str, Any]]:
        return self.get("presets/")

    def resolve(
        self, ref: str, *, fingerprint: str = "", before: str = "", owner: str = ""
    ) -> dict[str, Any]:
        """GET /runs/resolve: a run id (or a unique prefix of one) or ``latest:<label>`` -> the
        run (RunSerializer)."""
        return self.get(
            "runs/resolve", ref=ref, fingerprint=fingerprint, before=before, owner=owner
        )

    def mark_baseline(self, run_id: str, label: str) -> dict[str, Any]:
        """Label the run (POST /runs/{id}/labels)."""
        return self.request("POST", f"runs/{_seg(run_id)}/labels", json={"label": label})

    def unmark_baseline(self, run_id: str, label: str) -> None:
        self.request("DELETE", f"runs/{_seg(run_id)}/labels", params={"label": label})

    def baselines(self, *, label: str = "", fingerprint: str = "", owner: str = "") -> Any:
        """Labelled runs (GET /labels/)."""
        return self.get("labels/", label=label, fingerprint=fingerprint, owner=owner)

    def noise_history(
        self, fingerprint: str, owner: str, before: str, configuration: str = ""
    ) -> dict[str, Any]:
        """GET /history/?point=*: the earlier runs of ``owner``'s series ``fingerprint``
        (of the configuration ``configuration``, when given; created before the run
        ``before``) and their values per point and metric."""
        return self.get(
            "history/",
            fingerprint=fingerprint,
            point="*",
            owner=owner,
            before=before,
            configuration=configuration,
        )


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _retry_wait(value: float | None) -> float:
    """The wait budget: the argument, else SERVEBENCH_RETRY_WAIT_S, else the default."""
    if value is not None:
        return max(0.0, value)
    text = os.environ.get("SERVEBENCH_RETRY_WAIT_S", "").strip()
    if not text:
        return DEFAULT_RETRY_WAIT_S
    try:
        seconds = float(text)
    except ValueError:
        raise ServebenchError(
            f"SERVEBENCH_RETRY_WAIT_S={text!r} is not a number of seconds; set it to e.g. 120, "
            "or 0 to never wait out a rate limit"
        ) from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ServebenchError(
            f"SERVEBENCH_RETRY_WAIT_S={text!r} must be a finite number of seconds >= 0"
        )
    return seconds


def _retry_after(response: requests.Response) -> float | None:
    """Seconds a 429 asks to wait (Retry-After: seconds or an HTTP date), or None."""
    value = (response.headers.get("Retry-After") or "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _seg(value: str) -> str:
    return quote(value.strip(), safe="")


def _json(response: requests.Response) -> Any:
    if "json" not in response.headers.get("Content-Type", ""):
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _reason(exc: requests.ConnectionError) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "No route to host",
                   "Temporary failure in name resolution", "certificate verify failed",
                   "timed out", "Network is unreachable"):  # fmt: skip
        if marker in text:
            return marker.lower()
    return exc.__class__.__name__


def _api_error(
    base: str, method: str, path: str, response: requests.Response, body: Any
) -> ServebenchError:
    status = response.status_code
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        if status in (502, 503, 504):
            return TransientError(
                f"the portal at {base} answered HTTP {status} (a proxy in front of it, or it "
                "is restarting); try again in a minute"
            )
        return ServebenchError(
            f"{base} answered HTTP {status} to {method} /api/v1/{path} without the API's error "
            "body; check that SERVEBENCH_URL is the servebench portal's root URL"
        )
    code = str(error.get("code") or "")
    message = str(error.get("message") or "").strip()
    field = str(error.get("field") or "")
    if status == 401:
        what = (
            "the token was refused (invalid, expired or revoked)"
            if code == "invalid_token"
            else "this needs an API token"
        )
        if code not in ("invalid_token", "not_authenticated"):
            what = message
        return ApiError(f"{base}: {what}; {CREDENTIALS_HELP}", status, code, field)
    if code == "invalid_spec":
        return ApiError(f"invalid spec: {message}", status, code, field)
    if status == 429:
        wait = _retry_after(response)
        when = f"in {wait:.0f} s" if wait is not None else "later"
        text = f"{message or 'rate limited'} (HTTP 429); try again {when}"
        if wait is not None:
            text += " (SERVEBENCH_RETRY_WAIT_S lets servebench wait that long itself)"
        return ApiError(text, status, code, field)
    if status >= 500:
        cls = TransientError if status in (502, 503, 504) else ApiError
        text = f"the portal at {base} answered HTTP {status} ({code}: {message}); "
        text += "try again later, or ask its operator (the error is in the portal's log)"
        return cls(text, status, code, field) if cls is ApiError else cls(text)
    return ApiError(message or f"HTTP {status} ({code})", status, code, field)
