"""Several load generators on Kubernetes: each client in a Pod of its own.

On one machine ``runners.multiclient`` runs a point's N clients as processes pinned to
cores of the runner's. A large deployment needs more load than one Pod's cores can send,
so where the portal asks for it (``SERVEBENCH_CLIENT_POD``: the client Pod's manifest,
the runner image with the load generator's CPU and memory and no GPU, the Hugging Face
cache for the tokenizer, every placement the portal applies to runner Pods), each client
of a point with ``workload.clients: N`` runs in a Pod of its own, created by the runner
through the Kubernetes API (``runners.kube.KubeAPI``, the runner Role's Pods), owned by
the runner's Pod (the garbage collector deletes it with the runner), named
``<runner pod>-<backend>-lg<i>-<nonce>``.

**The rendezvous.** The runner serves a small HTTP endpoint on its Pod IP
(``SERVEBENCH_POD_IP``), under a random path token per point:

- ``POST /<token>/ready/<i>``: client ``i`` is ready to send (``runners.loadgen``'s
  barrier, after its tokenizer, dataset, test request and warm-ups);
- ``GET /<token>/go``: 204 until every client is ready, then
  ``{"start_at": epoch seconds}``, ``START_DELAY_S`` ahead, when every client sends its
  first timed request (each by its node's clock: the start skew the result reports
  includes the nodes' clock offsets);
- ``PUT /<token>/file/<i>/<result|report|log>``: the client's result (vLLM's JSON with
  every request's samples), its report (CPU, run-queue wait, send lag, start) and its
  log, written where a local client's would be, so the exact merge
  (``runners.clientmerge``) and the saturation evidence are the same code either way.

The Pod runs ``runners.podclient``, which runs ``runners.bench_client`` with the
point's share of the load and uploads the three files before it exits. A Pod that cannot
start (unschedulable, image pull), that exits non-zero, or that is not ready at the
barrier within ``READY_TIMEOUT_S`` fails the point with the Pod's own reason and its
log; every client Pod is deleted when the point ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from runners import kube
from runners import multiclient as mc

CLIENT_POD_ENV = "SERVEBENCH_CLIENT_POD"  # the client Pod's manifest (JSON), from the portal
POD_IP_ENV = "SERVEBENCH_POD_IP"  # the runner Pod's IP (the downward API)
CONTAINER = "client"
COMPONENT = "loadgen"
POD_WORKDIR = "/tmp/servebench-client"  # noqa: S108 (the client Pod's own)
FILES = ("result", "report", "log")
MAX_UPLOAD_BYTES = 1 << 30
# The network between Pods and the clients' 20 ms polls: a start every client hears of.
START_DELAY_S = 0.5
# From the Pods' creation to every client ready at the barrier: scheduling, the image
# (already on the node: the runner's), Python importing vLLM, the tokenizer, warm-ups.
READY_TIMEOUT_S = 900.0
POLL_S = 0.5


class PodClientError(RuntimeError):
    """A client Pod could not take part (said for a person, with what to do)."""


def template_from_env(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The client Pod the portal asked for (``SERVEBENCH_CLIENT_POD``), or None."""
    return kube.pod_template(CLIENT_POD_ENV, CONTAINER, PodClientError, environ)


def available(environ: dict[str, str] | None = None) -> bool:
    """Did the portal ask for client Pods (each point's clients on cores of their own)?"""
    return bool((os.environ if environ is None else environ).get(CLIENT_POD_ENV, "").strip())


def own_ip(environ: dict[str, str] | None = None) -> str:
    """The runner Pod's IP: the downward API's, else the address this host routes from."""
    env = os.environ if environ is None else environ
    if ip := env.get(POD_IP_ENV, "").strip():
        return ip
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # no packet is sent: only a route is chosen
        return str(s.getsockname()[0])


def pod_argv(argv: Sequence[str]) -> list[str]:
    """A local client's command as its Pod runs it: ``python`` of the image, and the
    result written in the Pod's own directory (``runners.podclient`` uploads it)."""
    out = ["python", *argv[1:]]
    if "--result-dir" in out:
        out[out.index("--result-dir") + 1] = POD_WORKDIR
    return out


class Rendezvous:
    """The runner's side of the barrier and the uploads (module doc), on its own thread."""

    def __init__(self, clients: Sequence[mc.Client], host: str) -> None:
        self.clients = {c.index: c for c in clients}
        self.token = secrets.token_urlsafe(18)
        self.ready: dict[int, float] = {}
        self.received: dict[int, set[str]] = {c.index: set() for c in clients}
        self.start_at: float | None = None
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("0.0.0.0", 0), self._handler())  # noqa: S104
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}/{self.token}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def all_ready(self) -> bool:
        with self._lock:
            return len(self.ready) == len(self.clients)

    def release(self, start_at: float) -> None:
        with self._lock:
            self.start_at = start_at

    def has(self, index: int, kind: str) -> bool:
        with self._lock:
            return kind in self.received[index]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Rendezvous:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _route(self, path: str) -> list[str] | None:
        parts = path.strip("/").split("/")
        if not parts or not secrets.compare_digest(parts[0], self.token):
            return None
        return parts[1:]

    def _client(self, text: str) -> mc.Client | None:
        return self.clients.get(int(text)) if text.isdigit() else None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        rendezvous = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # the runner's log is the client's
                pass

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                if body:
                    self.send_header("Content-Type", "application/json")
                self.end_headers()
                if body:
                    self.wfile.write(body)

            def do_GET(self) -> None:
                if rendezvous._route(self.path) != ["go"]:
                    return self._answer(404)
                with rendezvous._lock:
                    start_at = rendezvous.start_at
                if start_at is None:
                    return self._answer(204)
                return self._answer(200, json.dumps({"start_at": start_at}).encode())

            def do_POST(self) -> None:
                route = rendezvous._route(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(min(length, 64))
                if not route or route[0] != "ready" or len(route) != 2:
                    return self._answer(404)
                client = rendezvous._client(route[1])
                if client is None:
                    return self._answer(404)
                with rendezvous._lock:
                    rendezvous.ready.setdefault(client.index, time.time())
                return self._answer(200)

            def do_PUT(self) -> None:
                route = rendezvous._route(self.path)
                if not route or len(route) != 3 or route[0] != "file" or route[2] not in FILES:
                    return self._answer(404)
                client = rendezvous._client(route[1])
                if client is None:
                    return self._answer(404)
                length = int(self.headers.get("Content-Length") or -1)
                if not 0 <= length <= MAX_UPLOAD_BYTES:
                    return self._answer(413)
                target: Path = getattr(client, route[2])
                partial = target.with_name(target.name + ".part")
                with open(partial, "wb") as out:
                    left = length
                    while left:
                        chunk = self.rfile.read(min(left, 1 << 20))
                        if not chunk:
                            return self._answer(400)
                        out.write(chunk)
                        left -= len(chunk)
                partial.replace(target)
                with rendezvous._lock:
                    rendezvous.received[client.index].add(route[2])
                return self._answer(200)

        return Handler


class PodClients:
    """Creates a point's client Pods, releases them together, waits for their files."""

    def __init__(
        self,
        api: kube.KubeAPI,
        template: dict[str, Any],
        owner: dict[str, str],
        host: str,
        key_env: str | None = None,
    ) -> None:
        self.api = api
        self.template = template
        self.owner = owner  # the runner's Pod: name, uid
        self.host = host
        self.key_env = key_env  # where the Pod finds the endpoint's key (a Secret's env)
        self.names: dict[int, str] = {}
        self.nodes: dict[int, str | None] = {}

    def manifest(self, client: mc.Client, name: str, url: str, backend: str) -> dict[str, Any]:
        labels = {
            kube.COMPONENT_LABEL: COMPONENT,
            kube.BACKEND_LABEL: kube.label_value(backend),
            "servebench.dev/client-index": str(client.index),
        }
        pod = kube.owned_pod(self.template, name, self.owner, labels)
        (container,) = pod["spec"]["containers"]
        command = ["python", "-m", "runners.podclient", "--rendezvous", url]
        command += ["--index", str(client.index)]
        if self.key_env:
            command += ["--key-env", self.key_env]
        container["command"] = [*command, "--", *pod_argv(client.argv)]
        return pod

    def _why_failed(self, client: mc.Client, why: str) -> tuple[int, mc.Client]:
        name = self.names[client.index]
        try:
            log = self.api.pod_log(name, container=CONTAINER, lines=200)
        except kube.KubeError as exc:
            log = f"(its log could not be read: {exc})"
        with open(client.log, "a") as out:
            out.write(f"client Pod {name} {why}\n{log}")
        return 1, client

    def run(self, clients: Sequence[mc.Client], backend: str) -> tuple[int, mc.Client | None]:
        """Every client in its Pod, released together; (0, None) once each has exited 0
        with its files uploaded, else (exit code, the first client that failed)."""
        nonce = secrets.token_hex(3)
        for c in clients:
            for path in (c.result, c.report, c.log):
                path.unlink(missing_ok=True)
        with Rendezvous(clients, self.host) as meet:
            try:
                for c in clients:
                    name = kube.pod_name(self.owner["name"], f"{backend}-lg{c.index}-{nonce}")
                    self.names[c.index] = name
                    self.api.create_pod(self.manifest(c, name, meet.url, backend))
                return self._wait(clients, meet)
            finally:
                self.stop()

    def _wait(self, clients: Sequence[mc.Client], meet: Rendezvous) -> tuple[int, mc.Client | None]:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            done = 0
            for c in clients:
                pod = self.api.pod(self.names[c.index])
                if pod is not None and self.nodes.get(c.index) is None:
                    self.nodes[c.index] = (pod.get("spec") or {}).get("nodeName")
                state = kube.container_state(pod or {}, CONTAINER)
                ended = state.get("terminated")
                if ended is not None:
                    code = int(ended.get("exitCode") or 0)
                    if code != 0:
                        self._why_failed(c, f"exited with code {code}")
                        return code, c
                    if not all(meet.has(c.index, k) for k in ("result", "report")):
                        return self._why_failed(c, "exited without uploading its result")
                    done += 1
                    continue
                why = kube.why_not_running(pod, CONTAINER)
                if why is not None:
                    return self._why_failed(c, why)
            if done == len(clients):
                return 0, None
            if meet.start_at is None:
                if meet.all_ready():
                    meet.release(time.time() + START_DELAY_S)
                elif time.monotonic() > deadline:
                    late = next(c for c in clients if c.index not in meet.ready)
                    pod = self.api.pod(self.names[late.index])
                    return self._why_failed(
                        late,
                        f"was not ready at the start barrier within {READY_TIMEOUT_S:.0f} s "
                        f"({kube.pending_reason(pod, CONTAINER)})",
                    )
            time.sleep(POLL_S)

    def stop(self) -> None:
        """Delete every client Pod of the point and wait (bounded) until they are gone."""
        for name in self.names.values():
            with contextlib.suppress(kube.KubeError):  # else its owner reference deletes it
                self.api.delete_pod(name, grace_s=5)
        deadline = time.monotonic() + 60
        for name in self.names.values():
            try:
                while self.api.pod(name) is not None and time.monotonic() < deadline:
                    time.sleep(POLL_S)
            except kube.KubeError:
                pass

    def placement(self, cpu: str | None) -> str:
        share = f" ({cpu} CPU each)" if cpu else ""
        nodes = sorted({n for n in self.nodes.values() if n})
        return f"each client in a Pod of its own{share}, on {', '.join(nodes) or 'unknown nodes'}"


def launcher(key_env: str | None = None) -> PodClients | None:
    """Client Pods where the portal asked for them (``SERVEBENCH_CLIENT_POD``), else None
    (the clients run on the runner's cores)."""
    template = template_from_env()
    if template is None:
        return None
    owner = kube.runner_owner(CLIENT_POD_ENV, "client Pods are", PodClientError)
    return PodClients(kube.KubeAPI.in_cluster(), template, owner, own_ip(), key_env)


def cpu_request(template: dict[str, Any]) -> str | None:
    (container,) = template["spec"]["containers"]
    return ((container.get("resources") or {}).get("requests") or {}).get("cpu")


def measure(
    launch: PodClients,
    clients: Sequence[mc.Client],
    backend: str,
    result_path: Path,
    report_path: Path,
    slo: dict[str, float] | None,
    rate: float | None,
) -> tuple[int, Path | None, list[dict[str, Any]]]:
    """``runners.multiclient.measure`` with each client in a Pod of its own."""
    code, bad = launch.run(clients, backend)
    if code != 0:
        return code, bad.log if bad is not None else None, []
    how = launch.placement(cpu_request(launch.template))
    for c in clients:
        c.placement = how
    return mc.merge_clients(
        clients,
        result_path,
        report_path,
        slo,
        rate,
        where=lambda c: f"Pod {launch.names[c.index]} on {launch.nodes.get(c.index) or '?'}",
        clock_offset=time.time() - time.perf_counter(),  # onto the runner's clock
    )
