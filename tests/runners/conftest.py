"""A stand-in for the portal's runner-ingestion endpoints, on a real local HTTP server.

It speaks docs/protocol.md: ``POST {url}/events`` and ``POST {url}/measurements``
(201 created, 200 when the same (backend, point.key, repeat) was already stored).
Tests script failures per endpoint (``fail_next``) to exercise retries and
cancellation, then read back what arrived, in order.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Received:
    path: str
    body: dict[str, Any]
    authorization: str | None
    status: int


@dataclass
class FakePortal:
    url: str
    received: list[Received] = field(default_factory=list)
    measurements: dict[tuple, dict[str, Any]] = field(default_factory=dict)
    # endpoint ('events' | 'measurements') -> status codes to answer before accepting
    fail_next: dict[str, list[int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, endpoint: str, body: dict[str, Any]) -> int:
        with self.lock:
            queued = self.fail_next.get(endpoint) or []
            if queued:
                return queued.pop(0)
            if endpoint == "measurements":
                key = (body["backend"], body["point"]["key"], body["repeat"])
                if key in self.measurements:
                    return 200
                self.measurements[key] = body
                return 201
            return 200

    def events(self) -> list[dict[str, Any]]:
        return [r.body for r in self.received if r.path.endswith("/events") and r.status == 200]


def _handler(portal: FakePortal) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            endpoint = self.path.rstrip("/").rsplit("/", 1)[-1]
            status = portal.answer(endpoint, body)
            with portal.lock:
                portal.received.append(
                    Received(self.path, body, self.headers.get("Authorization"), status)
                )
            payload = json.dumps({"ok": status < 400, "run_status": "running"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def portal() -> Iterator[FakePortal]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), None)  # type: ignore[arg-type]
    fake = FakePortal(url=f"http://127.0.0.1:{server.server_port}/api/v1/runner/runs/r1")
    server.RequestHandlerClass = _handler(fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()
