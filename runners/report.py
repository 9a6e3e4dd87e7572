"""The runner -> portal HTTP reporter (docs/protocol.md).

Every measurement is posted as soon as it exists, so a run that dies later loses
nothing already measured. Posting is idempotent on (backend, point key, repeat), which
makes retrying safe: connection errors, timeouts, 5xx, 408 and 429 are retried with
exponential backoff and full jitter for up to ``max_elapsed_s`` (10 minutes by default,
longer than a portal restart). A 409 means the run was cancelled: ``RunCancelled`` tells
the runner to stop. Any other 4xx is final and raised as ``ReportRejected``.
"""

from __future__ import annotations

import gzip
import json
import logging
import random
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import requests

from runners import samplesfile
from runners.egress import Egress, EgressRefused
from runners.result import Event, FullSamples, Measurement

log = logging.getLogger(__name__)


def _retryable(status: int) -> bool:
    return status >= 500 or status in (408, 429)


class ReportError(RuntimeError):
    """The portal stayed unreachable (or kept failing) for the whole retry budget."""


class ReportRejected(RuntimeError):
    """The portal refused a message for good (a 4xx other than 408/409/429)."""

    def __init__(self, status: int, body: str) -> None:
        self.status = status
        super().__init__(f"the portal answered {status}: {body[:300]}")


class RunCancelled(RuntimeError):
    """The portal answered 409: the run was cancelled; stop without further reports."""


# Bodies above this are sent gzip-compressed (a measurement's per-request samples: tens
# of MB of JSON for a large point, several times smaller compressed).
COMPRESS_ABOVE = 64 * 1024


def encode(body: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """The JSON body and its headers; gzip (``Content-Encoding: gzip``) when it is large."""
    data = json.dumps(body, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json"}
    if len(data) > COMPRESS_ABOVE:
        data = gzip.compress(data, compresslevel=6, mtime=0)
        headers["Content-Encoding"] = "gzip"
    return data, headers


class Reporter:
    """Posts events and measurements for one run: ``POST {url}/events|measurements``."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        max_elapsed_s: float = 600.0,
        base_delay_s: float = 1.0,
        max_delay_s: float = 15.0,
        timeout_s: float = 30.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.max_elapsed_s = max_elapsed_s
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.timeout_s = timeout_s
        # Only to the portal's origin, never following a redirect (runners.egress).
        self._session = Egress.portal(self.url).session()
        self._session.headers["Authorization"] = f"Bearer {token}"
        self._session.headers["User-Agent"] = "servebench-runner"

    def event(self, event: Event, *, max_elapsed_s: float | None = None) -> dict[str, Any]:
        return self._post("events", event.model_dump(mode="json", exclude_none=True), max_elapsed_s)

    def measurement(self, measurement: Measurement) -> dict[str, Any]:
        """Post ``measurement``; arrays past ``samplesfile.inline_values()`` numbers are
        uploaded as a stream first and the measurement carries a reading sample of them
        (``runners.samplesfile``)."""
        limit = samplesfile.inline_values()
        if measurement.samples_full is not None and measurement.samples_file is not None:
            self._put_samples(
                measurement, measurement.samples_file, measurement.samples_full.sha256
            )
        elif measurement.samples_full is None and samplesfile.values_in(measurement.detail) > limit:
            measurement = self._upload_samples(measurement, limit)
        return self._post("measurements", measurement.model_dump(mode="json"), None)

    def _put_samples(self, m: Measurement, path: Path, digest: str) -> None:
        """``PUT {url}/samples?backend=&point=&repeat=`` with the gzip file ``path`` (a
        stream from disk, retried like a post)."""
        params = {"backend": m.backend, "point": m.point.key, "repeat": str(m.repeat)}
        headers = {"Content-Type": "application/gzip", "X-Content-SHA256": digest}
        self._send("PUT", "samples", partial(path.open, "rb"), headers, None, params)

    def _upload_samples(self, m: Measurement, limit: int) -> Measurement:
        """Upload ``m``'s full arrays (written to a file a slice at a time); ``m`` with a
        reading sample instead."""
        with tempfile.TemporaryDirectory(prefix="servebench-samples-") as tmp:
            path = Path(tmp) / "samples.json.gz"
            size, digest = samplesfile.write_file(m.detail, path)
            self._put_samples(m, path, digest)
        seed = f"{m.backend}|{m.point.key}|{m.repeat}"
        sample, kept = samplesfile.reading_sample(m.detail, limit, seed)
        full = FullSamples(
            requests=samplesfile.requests_in(m.detail), kept=kept, bytes=size, sha256=digest
        )
        log.info(
            "%s %s #%s: %d requests' samples uploaded (%d bytes); the measurement carries %d",
            m.backend, m.point.key, m.repeat, full.requests, size, kept,
        )  # fmt: skip
        return m.model_copy(update={"detail": sample, "samples_full": full})

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after and retry_after.strip().isdigit():
            return min(float(retry_after), self.max_delay_s)
        # Full jitter: many runners retrying after one portal restart do not stampede.
        cap = min(self.max_delay_s, self.base_delay_s * 2**attempt)
        return random.uniform(0, cap)  # noqa: S311 (jitter, not cryptography)

    def _post(self, path: str, body: dict[str, Any], max_elapsed_s: float | None) -> dict[str, Any]:
        data, headers = encode(body)
        return self._send("POST", path, lambda: data, headers, max_elapsed_s)

    def _send(
        self,
        method: str,
        path: str,
        body: Callable[[], Any],
        headers: dict[str, str],
        max_elapsed_s: float | None,
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send ``body()`` (bytes, or a binary file opened anew for each attempt, closed
        after it) until the portal accepts it, retrying as the module says."""
        deadline = time.monotonic() + (max_elapsed_s or self.max_elapsed_s)
        url = f"{self.url}/{path}"
        attempt = 0
        while True:
            retry_after = None
            data = body()
            try:
                response = self._session.request(
                    method, url, data=data, headers=headers, params=params, timeout=self.timeout_s
                )
            except EgressRefused as exc:  # a redirect: final, nothing was sent there
                raise ReportRejected(exc.status or 0, str(exc)) from None
            except (requests.ConnectionError, requests.Timeout) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code in (200, 201):
                    try:
                        return response.json()
                    except ValueError:
                        return {}
                if response.status_code == 409:
                    raise RunCancelled(response.text[:300] or "the run was cancelled")
                if not _retryable(response.status_code):
                    raise ReportRejected(response.status_code, response.text)
                problem = f"HTTP {response.status_code}"
                retry_after = response.headers.get("Retry-After")
            finally:
                if hasattr(data, "close"):
                    data.close()
            delay = self._delay(attempt, retry_after)
            if time.monotonic() + delay > deadline:
                raise ReportError(f"{method} {url} kept failing ({problem}); gave up after retries")
            log.warning("%s %s failed (%s); retrying in %.1f s", method, url, problem, delay)
            time.sleep(delay)
            attempt += 1


class NoReporter:
    """Stands in when the run has no portal (``--out`` only): reports go nowhere."""

    def event(self, event: Event, *, max_elapsed_s: float | None = None) -> dict[str, Any]:
        return {}

    def measurement(self, measurement: Measurement) -> dict[str, Any]:
        return {}
