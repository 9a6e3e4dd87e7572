"""No request the runner makes leaves its allow-list, redirects included (runners.egress).

Two real HTTP servers on loopback: ``allowed`` is the target the run names (an endpoint
of its spec, a server it started, its portal) and answers some paths with a redirect to
``elsewhere``, which records every request it gets. Each client of the runner is driven
at ``allowed``: the endpoint probes and facts (what the environment capture records),
the /metrics scraper, a point's request probe, the reporter, and the bench client's
aiohttp process. Every redirect must be an error that names the target, the status and
the host it pointed at, and ``elsewhere`` must have received nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runners import egress
from runners.endpoint import Endpoint, describe_all
from runners.report import Reporter, ReportRejected
from runners.result import Event
from runners.server_metrics import PointWatcher, scrape_text
from runners.spec import parse_spec
from runners.vllm_bench import measure_point, probe

# Its slow tests assert nothing a busy CPU changes: make test runs them beside others.
pytestmark = pytest.mark.shares_cpu

REPO = Path(__file__).resolve().parents[2]
METRICS = "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total 3.0\n"


@dataclass
class Server:
    """A loopback HTTP server: ``routes`` maps a path prefix to (status, headers, body)
    (longest prefix first; 404 otherwise); ``seen`` lists (method, path) received."""

    routes: dict[str, tuple[int, dict[str, str], str]] = field(default_factory=dict)
    seen: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""

    def answer(self, method: str, path: str) -> tuple[int, dict[str, str], str]:
        self.seen.append((method, path))
        for prefix in sorted(self.routes, key=len, reverse=True):
            if path.startswith(prefix):
                return self.routes[prefix]
        return 404, {}, "not found"


def _serve(server: Server) -> Iterator[Server]:
    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            status, headers, body = server.answer(self.command, self.path)
            data = body.encode()
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_HEAD = _any

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def elsewhere() -> Iterator[Server]:
    """The host a redirect points at (say, the portal's /api/v1/runs/?owner=me)."""
    yield from _serve(Server(routes={"/": (200, {}, "{}")}))


@pytest.fixture
def allowed(elsewhere: Server) -> Iterator[Server]:
    """The allow-listed target: every path redirects to ``elsewhere`` unless a test
    routes it otherwise."""
    to = {"Location": f"{elsewhere.url}/api/v1/runs/?owner=me"}
    yield from _serve(Server(routes={"/": (302, to, "")}))


def endpoint_spec(base_url: str, **api_key: str) -> Any:
    backend: dict[str, Any] = {"kind": "endpoint", "name": "prod", "base_url": base_url}
    if api_key:
        backend["api_key"] = api_key
    return parse_spec(
        {
            "model": {"id": "org/tiny-model", "max_model_len": 512},
            "workload": {"input_len": 16, "output_len": 4, "num_prompts": 2, "num_warmups": 0},
            "backends": [backend],
        }
    )


def assert_refused(message: str, allowed: Server, elsewhere: Server, status: int = 302) -> None:
    """The message names the status, the host the redirect pointed at and what to do;
    nothing reached that host."""
    assert f"with {status}" in message, message
    assert "a redirect to host '127.0.0.1'" in message and elsewhere.url in message, message
    assert "follows no redirects" in message, message
    assert elsewhere.seen == []


# --------------------------------------------------------------------------- the rule


def test_a_session_refuses_other_origins_before_sending_anything(allowed, elsewhere):
    session = egress.pinned_session(allowed.url, "the target")
    with pytest.raises(egress.EgressRefused, match="is not a request the target may be sent"):
        session.get(f"{elsewhere.url}/anything", timeout=5)
    rule = egress.Egress([allowed.url], "x")
    assert rule.allows(f"{allowed.url}/any/path?q=1")
    assert not rule.allows(allowed.url.rsplit(":", 1)[0] + ":9")  # another port
    assert not rule.allows(allowed.url.replace("127.0.0.1", "localhost"))  # another name
    assert not rule.allows(allowed.url.replace("http:", "https:"))
    assert elsewhere.seen == [] and allowed.seen == []


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_every_redirect_status_is_an_error_whatever_the_caller_asks(allowed, elsewhere, status):
    allowed.routes["/"] = (status, {"Location": f"{elsewhere.url}/x"}, "")
    session = egress.pinned_session(allowed.url, "the target")
    with pytest.raises(egress.EgressRefused) as refused:
        session.post(f"{allowed.url}/v1/completions", json={}, allow_redirects=True, timeout=5)
    assert refused.value.status == status
    assert_refused(str(refused.value), allowed, elsewhere, status)


def test_a_relative_location_is_named_too(allowed, elsewhere):
    allowed.routes["/"] = (302, {"Location": "/login?next=/v1/models"}, "")
    with pytest.raises(egress.EgressRefused, match=r"a redirect to host '127\.0\.0\.1'"):
        egress.pinned_session(allowed.url, "the target").get(f"{allowed.url}/v1/models")
    assert allowed.seen == [("GET", "/v1/models")]  # the login page was not fetched


def test_a_spec_endpoint_list_pins_only_its_own_hosts(allowed, elsewhere):
    rule = egress.Egress.for_spec(endpoint_spec(allowed.url))
    assert rule.allows(f"{allowed.url}/v1/models")
    with pytest.raises(egress.EgressRefused):
        rule.pinned(elsewhere.url)
    with pytest.raises(ValueError, match="not on loopback"):
        egress.Egress.local_server("http://10.0.0.7:8000", "the vLLM server")


# --------------------------------------------------------------------------- the clients


def test_the_endpoint_probes_do_not_follow_a_redirect(allowed, elsewhere, tmp_path):
    spec = endpoint_spec(allowed.url)
    target = Endpoint(spec, spec.backends[0], None, tmp_path / "endpoint.log")
    assert target.alive is False
    reason = target.unreachable_reason()
    assert "endpoint 'prod'" in reason and "point base_url at the final URL" in reason
    assert_refused(reason, allowed, elsewhere)
    assert elsewhere.url in (tmp_path / "endpoint.log").read_text()


def test_the_environment_facts_of_an_endpoint_do_not_follow_a_redirect(allowed, elsewhere):
    spec = endpoint_spec(allowed.url)
    facts = describe_all(spec, {"prod": "sk-not-for-elsewhere"})["prod"]
    assert facts["models"] == "unknown" and facts["metrics_exposed"] is False
    errors = "\n".join(facts["errors"])
    assert {p for _, p in allowed.seen} == {"/v1/models", "/version", "/metrics"}
    assert_refused(errors, allowed, elsewhere)


def test_the_metrics_scraper_does_not_follow_a_redirect(allowed, elsewhere):
    with pytest.raises(egress.EgressRefused) as refused:
        scrape_text(allowed.url)
    assert_refused(str(refused.value), allowed, elsewhere)
    # The point's watcher: its kept-alive connection too, and it stops asking.
    allowed.routes["/metrics"] = (200, {}, METRICS)
    allowed.routes["/metrics/"] = (307, {"Location": f"{elsewhere.url}/metrics"}, "")
    with PointWatcher(allowed.url, interval_s=0.02) as watcher:
        threading.Event().wait(0.2)
    telemetry = watcher.telemetry({})
    assert watcher.result().preemptions is None
    refusal = telemetry["sampler"]["scrape_refused"]
    assert_refused(refusal, allowed, elsewhere, status=307)
    assert sum(1 for _, p in allowed.seen if p.startswith("/metrics/")) == 1


def test_a_points_request_probe_does_not_follow_a_redirect(allowed, elsewhere, tmp_path):
    spec = endpoint_spec(allowed.url)
    target = Endpoint(spec, spec.backends[0], "sk-key", tmp_path / "endpoint.log")
    assert probe(target, spec, spec.points()[0], spec.backends[0]) is None
    assert ("POST", "/v1/completions") in allowed.seen
    assert elsewhere.seen == []


def test_the_reporter_does_not_follow_a_portal_redirect(allowed, elsewhere):
    allowed.routes["/"] = (308, {"Location": f"{elsewhere.url}/api/v1/runner/runs/r/events"}, "")
    reporter = Reporter(f"{allowed.url}/api/v1/runner/runs/r", "sb_run_secret", timeout_s=5)
    with pytest.raises(ReportRejected) as rejected:
        reporter.event(Event(type="started", total=1))
    assert "point --report at the portal's final URL" in str(rejected.value)
    assert_refused(str(rejected.value), allowed, elsewhere, status=308)


GUARD = """
import asyncio, sys
import aiohttp
from runners.bench_client import install_egress_guard

install_egress_guard(sys.argv[1])

async def main():
    async with aiohttp.ClientSession() as session:
        async with session.post(sys.argv[2], json={"prompt": "hi"}) as response:
            print("got status", response.status)

asyncio.run(main())
"""


@pytest.mark.parametrize("status", [302, 307])
def test_the_bench_clients_aiohttp_requests_do_not_follow_a_redirect(allowed, elsewhere, status):
    """What ``runners.bench_client`` installs before vLLM's client runs: in a process of
    its own, as the runner runs the client."""
    allowed.routes["/v1/completions"] = (status, {"Location": f"{elsewhere.url}/v1/c"}, "")
    code, out = _guarded(allowed.url, f"{allowed.url}/v1/completions")
    assert code == 3 and "got status" not in out
    assert f"servebench: the bench client's target ({allowed.url}) answered POST" in out
    assert_refused(out, allowed, elsewhere, status)
    # ... and a URL off its target is refused before anything is sent.
    code, out = _guarded(allowed.url, f"{elsewhere.url}/v1/completions")
    assert code == 3 and "is not a request the bench client's target" in out
    assert elsewhere.seen == []
    allowed.routes["/v1/completions"] = (200, {}, "{}")
    code, out = _guarded(allowed.url, f"{allowed.url}/v1/completions")
    assert code == 0 and "got status 200" in out


def _guarded(base_url: str, url: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", GUARD, base_url, url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.usefixtures("have_vllm")
def test_vllms_bench_client_sends_nothing_where_a_redirect_points(
    allowed, elsewhere, tiny_model, tmp_path
):
    """The whole point as the runner measures it: the endpoint answers its probes, then
    redirects the load. vLLM's client (aiohttp follows redirects by default) stops at
    once with the reason, and the point fails with it."""
    models = {"object": "list", "data": [{"id": "served", "root": "served", "object": "model"}]}
    allowed.routes["/v1/models"] = (200, {"Content-Type": "application/json"}, json.dumps(models))
    allowed.routes["/v1/completions"] = (307, {"Location": f"{elsewhere.url}/v1/completions"}, "")
    allowed.routes["/metrics"] = (404, {}, "")
    allowed.routes["/tokenize"] = (404, {}, "")  # the client then keeps its own prompts
    spec = parse_spec(
        {
            "model": {"id": str(tiny_model), "max_model_len": 512},
            "workload": {"input_len": 16, "output_len": 4, "num_prompts": 2, "num_warmups": 0},
            "backends": [
                {"kind": "endpoint", "name": "prod", "base_url": allowed.url, "model": "served"}
            ],
        }
    )
    backend = spec.backends[0]
    target = Endpoint(spec, backend, None, tmp_path / "endpoint.log")
    measured = measure_point(target, spec, backend, spec.points()[0], 0, tmp_path)
    assert measured.status == "failed" and measured.error is not None
    assert "with code 3" in measured.error, measured.error
    assert "answered POST /v1/completions with 307" in measured.error, measured.error
    assert_refused(measured.error, allowed, elsewhere, status=307)
