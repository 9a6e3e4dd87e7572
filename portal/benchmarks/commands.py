"""The commands a measurement's spec implies, and whether a runner's report matches them.

A runner reports the exact ``vllm serve``, ``vllm bench serve`` and HF baseline commands it
ran, and the run page puts them under Copy buttons: people paste them into a shell. A
runner is not trusted to report them honestly, so the page shows a reported command only
when it is the one the run's spec implies, built by the runner's own functions
(``runners.vllm_server.serve_flags``, ``runners.vllm_bench.bench_flags``, and the HF
baselines' ``runners.hf_config``, which imports neither torch nor numpy); only the free
port and the result file's directory and name may differ. Otherwise it shows the
implied command, with this portal's placeholders.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from runners import hf_config, multiclient, sla
from runners import spec as rs
from runners import transformers_server as ts
from runners.vllm_bench import bench_script
from runners.vllm_server import HOST, serve_flags, server_env

# Placeholders in the implied command, and what a runner's report may have there.
_PORT = "8000"
_DIR = "results"
_FILE = "result.json"
_WILD = {
    _PORT: re.compile(r"[0-9]{1,5}"),
    f"http://{HOST}:{_PORT}": re.compile(rf"http://{re.escape(HOST)}:[0-9]{{1,5}}"),
    _DIR: re.compile(r"/?[A-Za-z0-9._/\-]{1,1024}"),
    _FILE: re.compile(r"[A-Za-z0-9._\-]{1,256}"),
}


def implied(
    spec: rs.Spec, backend_name: str, point_key: str, clients: int | None = None
) -> dict[str, str]:
    """The commands the spec implies for one measurement: {'serve', 'bench'} for a vLLM
    backend or transformers serve, {'bench'} for an endpoint (nothing is served), {'hf'}
    for an HF baseline; {} when the spec has no such backend or point (an SLA search's
    points included). ``clients``: the load generators the runner's probe chose where the
    spec says ``workload.clients: auto``."""
    backend = next((b for b in spec.backends if b.name == backend_name), None)
    if isinstance(backend, rs.HFBackend):
        if point_key != "baseline":
            return {}
        return {"hf": hf_command(spec, backend)}
    if isinstance(backend, rs.HFBatchedBackend):  # a static batch per sweep point
        point = next((p for p in spec.points() if p.key == point_key), None)
        return {"hf": hf_command(spec, backend, point)} if point else {}
    if not isinstance(backend, rs.VLLMBackend | rs.EndpointBackend | rs.TransformersServeBackend):
        return {}
    point = next((p for p in spec.points() if p.key == point_key), None)
    value = sla.search_value(spec, point_key) if backend in spec.search_backends else None
    if point is None and value is not None:
        point = rs.search_point(spec, value)
    if point is None:
        return {}
    # One result file per load generator (workload.clients), all matched by placeholders.
    if spec.workload.clients == "auto" and clients:
        spec = multiclient.with_clients(spec, clients)
    results = [Path(_DIR) / _FILE] * multiclient.clients_for(spec, point)
    if isinstance(backend, rs.EndpointBackend):
        return {"bench": bench_script(spec, point, backend.base_url, results, backend)}
    bench = bench_script(spec, point, f"http://{HOST}:{_PORT}", results, backend)
    if isinstance(backend, rs.TransformersServeBackend):
        return {"serve": ts.serve_command(spec, backend, _PORT), "bench": bench}
    env = [f"{k}={v}" for k, v in server_env(backend).items()]
    serve = [*env, "vllm", "serve", spec.model.id, "--host", HOST, "--port", _PORT]
    return {"serve": shlex.join([*serve, *serve_flags(spec, backend)]), "bench": bench}


def hf_command(
    spec: rs.Spec, backend: rs.HFBackend | rs.HFBatchedBackend, point: rs.Point | None = None
) -> str:
    """The HF baseline's command for ``backend`` (hf-batched: at ``point``), as the runner
    runs it (``runners.hf_config.for_backend``)."""
    return hf_config.for_backend(spec, backend, point).command()


def matches(reported: str, expected: str) -> bool:
    """Whether ``reported`` is ``expected`` up to the port and result file placeholders."""
    try:
        got, want = shlex.split(reported), shlex.split(expected)
    except ValueError:
        return False
    if len(got) != len(want):
        return False
    for g, w in zip(got, want, strict=True):
        if g == w:
            continue
        wild = _WILD.get(w)
        if wild is None or not wild.fullmatch(g) or ".." in g.split("/"):
            return False
    return True


def shown(spec: rs.Spec, backend: str, point_key: str, reported: dict[str, str]) -> dict:
    """What the page shows for one measurement: ``commands`` (kind -> command, the
    runner's where it matches the spec, else the implied one) and ``replaced`` (the kinds
    whose reported command did not match)."""
    # With ``clients: auto`` the count is the probe's: the bench clients the runner ran.
    clients = str(reported.get("bench") or "").count("vllm bench serve") or None
    expected = implied(spec, backend, point_key, clients)
    out: dict[str, str] = {}
    replaced: list[str] = []
    for kind, command in expected.items():
        got = reported.get(kind)
        if got and matches(got, command):
            out[kind] = got
        else:
            out[kind] = command
            if got:
                replaced.append(kind)
    return {"commands": out, "replaced": replaced}
