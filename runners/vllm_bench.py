"""One vLLM sweep point: vLLM's bench client against a running server, parsed.

The client is vLLM's own (``runners.bench_client``) with every flag explicit, including
the ones whose defaults moved between releases (``--temperature 0``, percentiles,
``--request-rate inf``). Its ``--save-result --save-detailed`` JSON becomes the
Measurement: canonical metrics (``runners.result.METRIC_KEYS``), ``raw`` (everything but
per-request arrays) and ``detail`` (the arrays, minus generated texts).

A point where any request failed, or none completed, is a *failed* measurement carrying
the client's errors; its metrics are left empty so no chart ever plots a zero.

The client run is bracketed by ``runners.conditions.Watch``: the ``conditions`` of the
point (CPU time of the server, its engine and the client against wall time, other
processes on the owned cores, steal, load) and whether something competed for them.
vLLM's CPU build binds its OpenMP threads within the runner's cores
(``VLLM_CPU_OMP_THREADS_BIND=auto`` follows the affinity the runner pinned, which the
server inherits); the value in effect is recorded.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import requests

from runners import conditions as cond
from runners import procs
from runners.result import METRIC_KEYS, Measurement, PointInfo, utcnow
from runners.server_metrics import PointWatcher
from runners.spec import Point, Spec, VLLMBackend
from runners.vllm_server import VLLMServer

PER_REQUEST_KEYS = (
    "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
    "errors",
)  # fmt: skip
DROPPED_KEYS = ("generated_texts",)  # noise for random prompts, and megabytes of it


def bench_flags(spec: Spec, point: Point, base_url: str, result_path: Path) -> list[str]:
    """Every `vllm bench serve` flag for this point."""
    w = spec.workload
    m = spec.model
    flags = ["--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions"]
    flags += ["--model", m.id]
    if m.tokenizer:
        flags += ["--tokenizer", m.tokenizer]
    if m.trust_remote_code:
        flags.append("--trust-remote-code")
    if w.dataset == "random":
        flags += [
            "--dataset-name", "random",
            "--random-input-len", str(point.input_len),
            "--random-output-len", str(point.output_len),
            "--random-range-ratio", str(w.range_ratio),
            "--random-prefix-len", str(w.prefix_len),
        ]  # fmt: skip
    else:
        flags += [
            "--dataset-name", "sharegpt",
            "--dataset-path", str(w.dataset_path),
            "--sharegpt-output-len", str(point.output_len),
        ]  # fmt: skip
    rate = "inf" if point.request_rate is None else str(point.request_rate)
    flags += [
        "--num-prompts", str(point.num_prompts),
        "--max-concurrency", str(point.max_concurrency),
        "--request-rate", rate,
        "--burstiness", str(w.burstiness),
        "--seed", str(w.seed),
        "--num-warmups", str(w.num_warmups),
        "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,99",
    ]  # fmt: skip
    if w.ignore_eos:
        flags.append("--ignore-eos")
    if spec.slo:
        slo = spec.slo.model_dump(exclude_none=True)
        flags += ["--goodput", *(f"{k.removesuffix('_ms')}:{v:g}" for k, v in slo.items())]
    flags += [
        "--save-result", "--save-detailed",
        "--result-dir", str(result_path.parent),
        "--result-filename", result_path.name,
        "--disable-tqdm",
    ]  # fmt: skip
    return flags


def bench_command(flags: list[str]) -> str:
    return shlex.join(["vllm", "bench", "serve", *flags])


def split_result(data: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any], dict[str, Any]]:
    """Client JSON -> (canonical metrics, raw without arrays, per-request arrays)."""
    metrics = {
        k: float(data[k])
        for k in METRIC_KEYS
        if isinstance(data.get(k), int | float) and not isinstance(data.get(k), bool)
    }
    detail = {k: data[k] for k in PER_REQUEST_KEYS if k in data}
    raw = {k: v for k, v in data.items() if k not in PER_REQUEST_KEYS and k not in DROPPED_KEYS}
    return metrics, raw, detail


def client_failure(data: dict[str, Any], limit: int = 3) -> str | None:
    """Why a client result must not count (None when every request succeeded)."""
    completed = int(data.get("completed") or 0)
    failed = int(data.get("failed") or 0)
    if completed > 0 and failed == 0:
        return None
    seen: list[str] = []
    for err in data.get("errors") or []:
        text = " ".join(str(err).split())[:300]
        if text and text not in seen:
            seen.append(text)
    total = completed + failed or data.get("num_prompts", "?")
    head = f"{failed} of {total} requests failed" if failed else "no request completed"
    if not seen:
        return f"{head} (the client recorded no error text; see its log)"
    more = f" (+{len(seen) - limit} more distinct)" if len(seen) > limit else ""
    return f"{head}; errors: " + " | ".join(seen[:limit]) + more


def probe(server: VLLMServer, spec: Spec, point: Point) -> str | None:
    """Send one request shaped like the point's and quote the server's refusal, if any.

    The bench client records only the HTTP reason ('Bad Request'); the server's answer
    says what to change ("maximum context length is 512 tokens...").
    """
    if spec.workload.dataset != "random":
        return None
    body = {
        "model": spec.model.id,
        "prompt": [100] * (point.input_len + spec.workload.prefix_len),
        "max_tokens": point.output_len,
        "temperature": 0,
    }
    try:
        response = requests.post(f"{server.base_url}/v1/completions", json=body, timeout=120)
    except requests.RequestException:
        return None
    if response.status_code == 200:
        return None
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text
    return f"a request of this shape is refused with {response.status_code}: {message[:500]}"


def point_info(point: Point) -> PointInfo:
    return PointInfo(key=point.key, **point.model_dump())


def measure_point(
    server: VLLMServer,
    spec: Spec,
    backend: VLLMBackend,
    point: Point,
    repeat: int,
    workdir: Path,
    cores: cond.Cores | None = None,
) -> Measurement:
    """Run the bench client for one point against ``server``; never raises for a bad point.

    KeyboardInterrupt (Ctrl-C, SIGTERM via the CLI's handler) propagates after the
    client's process group is stopped.
    """
    started_at, t0 = utcnow(), time.monotonic()
    stem = f"{backend.name}-{point.key.replace(':', '-').replace('=', '')}-r{repeat}"
    result_path = workdir / f"{stem}.json"
    log_path = workdir / f"{stem}.client.log"
    result_path.unlink(missing_ok=True)
    flags = bench_flags(spec, point, server.base_url, result_path)
    fields: dict[str, Any] = {
        "commands": {"serve": server.command(), "bench": bench_command(flags)},
    }
    error: str | None = None
    # vLLM's CPU build binds its OpenMP threads by this (GPU builds ignore it).
    extra = {"vllm_cpu_omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")}
    try:
        if backend.enable_prefix_caching:
            server.reset_prefix_cache()
        with PointWatcher(server.base_url) as watcher:
            argv = [sys.executable, "-m", "runners.bench_client", *flags]
            with cond.Watch(cores or cond.own_cores(), extra=extra) as watch:
                code = procs.run(argv, log_path, env=procs.python_env())
        fields["conditions"] = watch.result()
        fields["server_metrics"] = watcher.result()
        fields["gpu_memory_peak_bytes"] = watcher.gpu_peak
        if not server.alive:
            error = (
                "the vLLM server exited during this point. "
                f"Last lines of its log ({server.log_path}):\n{server.log_tail()}"
            )
        elif code != 0 or not result_path.exists():
            error = (
                f"vLLM's bench client exited with code {code} without a result. "
                f"Last lines of its log ({log_path}):\n{procs.tail(log_path)}"
            )
        else:
            data = json.loads(result_path.read_text())
            metrics, fields["raw"], fields["detail"] = split_result(data)
            error = client_failure(data)
            if error is None:
                fields["metrics"] = metrics
            elif server.alive and (why := probe(server, spec, point)):
                error = f"{error}\n{why}"
    except Exception as exc:  # a broken point must not end the sweep
        error = f"{type(exc).__name__}: {exc}"
    return Measurement(
        backend=backend.name,
        backend_kind="vllm",
        point=point_info(point),
        repeat=repeat,
        status="failed" if error else "succeeded",
        error=error,
        started_at=started_at,
        finished_at=utcnow(),
        duration_s=round(time.monotonic() - t0, 3),
        **fields,
    )
