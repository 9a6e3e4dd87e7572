"""Runs with real-shaped results for the page tests, stored through the real services.

Every vLLM measurement starts from a recorded vLLM 0.32 bench client output
(``tests/runners/data``) and goes through the runner's own parser
(``runners.vllm_bench.split_result``); synthetic sweeps scale that recording along a
saturating throughput curve (latencies growing with load), so charts get many points
with the exact keys and per-request arrays the real client writes. Environments are
full ``runners.environment.capture``-shaped snapshots.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

from portal.benchmarks import environment, ingestion, intake
from portal.benchmarks.models import Run, RunStatus
from runners import result as rr
from runners.vllm_bench import split_result

DATA = Path(__file__).resolve().parents[1] / "runners" / "data"
RECORDED_C8 = "vllm-0.32-bench-serve-c8-detailed.json"
RECORDED_C4 = "vllm-0.32-bench-serve-c4.json"

# Llama-3.1-8B's shape: the seed's worked example (32 layers, 8 KV heads, head dim 128).
LLAMA_8B_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "dtype": "bfloat16",
    "tie_word_embeddings": False,
}


# An endpoint run with an SLA search over request rate (p99 TTFT within 500 ms): the
# SLA pages' and the runs list's tests store its search through ingestion.
SEARCH_SPEC: dict[str, Any] = {
    "name": "prod: how far within p99 TTFT",
    "model": {"id": "org/tiny-model", "max_model_len": 512},
    "workload": {"input_len": 64, "output_len": 16, "num_prompts": 16, "num_warmups": 0},
    "backends": [
        {
            "kind": "endpoint",
            "name": "prod",
            "base_url": "http://vllm.prod.svc.cluster.local:8000",
            "model": "qwen3",
            "request_fields": "openai",
        }
    ],
    "sla_search": {"axis": "request_rate", "slo": {"p99_ttft_ms": 500}, "low": 1, "high": 64},
}


def recording(name: str = RECORDED_C8) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def snapshot(
    *,
    gpu: str = "NVIDIA H100 80GB HBM3",
    vllm: str = "0.32.0",
    torch: str = "2.13.0",
    driver: str = "580.65.06",
    image: str = "ghcr.io/servebench/runner:0.1.0",
    digest: str = "sha256:" + "ab" * 32,
    config: dict[str, Any] | None = None,
    host: str = "gpu-node-1",
) -> dict[str, Any]:
    """An environment snapshot as runners.environment.capture() writes it."""
    cpu = gpu == "CPU"
    return {
        "runner_version": "0.1.0",
        "captured_at": "2026-11-30T06:00:00.000+00:00",
        "gpu": {
            "model": "none" if cpu else gpu,
            "count": 0 if cpu else 1,
            "memory_total_mib": "none" if cpu else 81559,
            "driver_version": "none" if cpu else driver,
            "cuda_driver_version": "none" if cpu else "13.0",
            "source": "none" if cpu else "nvml",
            "devices": [],
        },
        "software": {
            "python": "3.11.7",
            "vllm": vllm,
            "torch": torch,
            "transformers": "5.19.0",
            "triton": "3.5.0",
            "flashinfer": "not installed",
            "nccl": "2.27.3",
            "cuda_runtime": "none" if cpu else "12.9",
        },
        "model": {
            "id": "org/tiny-model",
            "revision": "0123456789abcdef0123456789abcdef01234567",
            "revision_source": "hub",
            "config": copy.deepcopy(config if config is not None else LLAMA_8B_CONFIG),
        },
        "benchmark": {"dtype": "bfloat16", "max_model_len": 4096},
        "host": {"hostname": host, "os": "Debian GNU/Linux 12", "cpu_count": 32},
        "kubernetes": {"in_cluster": True, "node": host, "pod": f"servebench-{host}"},
        "container": {"image": image, "image_digest": digest},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"} if cpu else {},
        "packages": {"vllm": vllm, "torch": torch, "transformers": "5.19.0", "numpy": "2.3.4"},
    }


def sweep_spec(
    concurrency: list[int],
    *,
    repeats: int = 1,
    slo: dict[str, float] | None = None,
    prompt_lengths: list[int] | None = None,
    output_lengths: list[int] | None = None,
    name: str = "synthetic sweep",
) -> dict[str, Any]:
    sweeps: list[dict[str, Any]] = [
        {"name": "concurrency", "axis": "max_concurrency", "values": concurrency}
    ]
    if prompt_lengths:
        sweeps.append({"name": "prompt-length", "axis": "input_len", "values": prompt_lengths})
    if output_lengths:
        sweeps.append({"name": "output-length", "axis": "output_len", "values": output_lengths})
    spec: dict[str, Any] = {
        "name": name,
        "model": {"id": "org/tiny-model", "max_model_len": 4096},
        "workload": {"input_len": 128, "output_len": 32, "num_prompts": 32, "num_warmups": 0},
        "sweeps": sweeps,
        "backends": [{"kind": "hf-sequential", "num_prompts": 4}, {"kind": "vllm"}],
        "repeats": repeats,
        "resources": {"gpu_count": 1, "timeout_minutes": 10},
    }
    if slo:
        spec["slo"] = slo
    return spec


def scaled_point(
    base: dict[str, Any], load: float, rng: random.Random, peak: float = 2000.0
) -> dict[str, Any]:
    """The recorded client output rescaled to a point on a saturating curve."""
    data = copy.deepcopy(base)
    tput = peak * load / (load + 6.0) * rng.uniform(0.98, 1.02)
    factor = tput / float(base["output_throughput"])
    for key in ("request_throughput", "output_throughput", "total_token_throughput"):
        data[key] = float(base[key]) * factor
    data["duration"] = float(base["duration"]) / factor
    slow = 1.0 + load / 8.0  # latency grows with the load
    for key in list(data):
        if key.endswith("_ms") and isinstance(data[key], int | float):
            data[key] = float(data[key]) * slow * rng.uniform(0.97, 1.03)
    data["ttfts"] = [t * slow for t in base["ttfts"]]
    data["latencies"] = [t * slow for t in base["latencies"]]
    data["itls"] = [[v * slow for v in row] for row in base["itls"]]
    data["max_concurrency"] = int(load)
    data["p90_ttft_ms"] = data["p99_ttft_ms"] * 0.8
    return data


def vllm_measurement(
    sweep: str,
    axis: str,
    value: float,
    data: dict[str, Any],
    *,
    repeat: int = 0,
    preemptions: float = 0.0,
    kv_peak: float = 0.3,
    gpu_peak: int | None = 70 * 2**30,
    input_len: int = 128,
    output_len: int = 32,
    concurrency: int | None = None,
    backend: str = "vllm",
    running_mean: float | None = None,
) -> rr.Measurement:
    metrics, raw, detail = split_result(data)
    label = str(int(value)) if float(value).is_integer() else str(value)
    return rr.Measurement(
        backend=backend,
        backend_kind="vllm",
        point=rr.PointInfo(
            key=f"{sweep}:{axis}={label}",
            sweep=sweep,
            axis=axis,
            value=value,
            input_len=input_len,
            output_len=output_len,
            max_concurrency=concurrency or int(value),
            num_prompts=32,
        ),
        repeat=repeat,
        status="succeeded",
        metrics=metrics,
        server_metrics=rr.ServerMetrics(
            preemptions=preemptions,
            kv_cache_usage_peak=kv_peak,
            samples=4,
            num_requests_running_mean=running_mean,
        ),
        gpu_memory_peak_bytes=gpu_peak,
        commands={
            "serve": "vllm serve org/tiny-model --dtype bfloat16 --max-model-len 4096",
            "bench": f"vllm bench serve --max-concurrency {concurrency or int(value)}",
        },
        raw=raw,
        detail=detail,
        started_at="2026-11-30T06:00:00+00:00",
        finished_at="2026-11-30T06:00:09+00:00",
        duration_s=9.0,
    )


def hf_measurement(throughput: float = 40.0, repeat: int = 0) -> rr.Measurement:
    return rr.Measurement(
        backend="hf-sequential",
        backend_kind="hf-sequential",
        point=rr.PointInfo(
            key="baseline",
            sweep="baseline",
            input_len=128,
            output_len=32,
            max_concurrency=1,
            num_prompts=4,
        ),
        repeat=repeat,
        status="succeeded",
        metrics={
            "output_throughput": throughput,
            "request_throughput": throughput / 32,
            "total_token_throughput": throughput * 5,
            "median_ttft_ms": 20.0,
            "p99_ttft_ms": 25.0,
            "median_tpot_ms": 24.0,
            "p99_tpot_ms": 26.0,
        },
        commands={"hf": "python -m runners hf --model org/tiny-model --dtype bfloat16"},
        started_at="2026-11-30T05:59:00+00:00",
        finished_at="2026-11-30T05:59:30+00:00",
        duration_s=30.0,
    )


def make_sweep_run(
    owner: Any,
    concurrency: list[int],
    *,
    repeats: int = 1,
    slo: dict[str, float] | None = None,
    prompt_lengths: list[int] | None = None,
    output_lengths: list[int] | None = None,
    preempt_from: int | None = None,
    name: str = "synthetic sweep",
    env: dict[str, Any] | None = None,
    seed: int = 1,
    peak: float = 2000.0,
    public: bool = False,
    finish: bool = True,
    spec: dict[str, Any] | None = None,
    running: float | None = None,
) -> Run:
    """A run through the real services: environment, HF baseline, every sweep point and
    repeat, then ``finished``. ``running``: the server's mean running batch as a share of
    each point's concurrency (none reported by default)."""
    rng = random.Random(seed)
    spec = spec or sweep_spec(
        concurrency,
        repeats=repeats,
        slo=slo,
        prompt_lengths=prompt_lengths,
        output_lengths=output_lengths,
        name=name,
    )
    run = intake.create_run(owner, spec, name, is_public=public)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    environment.store_environment(run, env if env is not None else snapshot(), "f" * 64)
    run.refresh_from_db()
    base = recording()
    for r in range(repeats):
        ingestion.ingest_measurement(run, hf_measurement(40.0 + r, repeat=r))
        for c in concurrency:
            data = scaled_point(base, c, rng, peak)
            pre = 25.0 * c if preempt_from is not None and c >= preempt_from else 0.0
            kv = min(1.0, 0.05 * c)
            ingestion.ingest_measurement(
                run,
                vllm_measurement(
                    "concurrency", "max_concurrency", c, data, repeat=r, preemptions=pre,
                    kv_peak=kv, running_mean=running * c if running else None,
                ),
            )  # fmt: skip
        for length in prompt_lengths or []:
            data = scaled_point(base, 16, rng, peak * max(0.2, 1 - length / 8192))
            ingestion.ingest_measurement(
                run,
                vllm_measurement(
                    "prompt-length", "input_len", length, data, repeat=r, input_len=length,
                    concurrency=16,
                ),
            )  # fmt: skip
        for length in output_lengths or []:
            data = scaled_point(base, 16, rng, peak)
            ingestion.ingest_measurement(
                run,
                vllm_measurement(
                    "output-length", "output_len", length, data, repeat=r, output_len=length,
                    concurrency=16,
                ),
            )  # fmt: skip
    if finish:
        ingestion.ingest_event(run, rr.Event(type="finished", status="succeeded", errors=[]))
    run.refresh_from_db()
    return run


BASELINES_CONCURRENCY = [1, 4]


def make_baselines_run(
    owner: Any,
    single: tuple[tuple[str, str, float], ...] | None = None,
    eager: bool = False,
) -> Run:
    """A finished run with every Hugging Face baseline beside vLLM: hf-sequential (40
    tok/s) and hf-static-cache (80) at their own point; hf-batched (50 x c) and
    transformers serve "ts-cb" (100 x c) at each concurrency, stored through the real
    ingestion service. ``single``: other single-point baselines, (name, kind, tok/s).
    ``eager``: a second vLLM configuration, "vllm-eager" (enforce_eager), at half of
    vLLM's output tok/s at each concurrency."""
    single = single or (
        ("hf-sequential", "hf-sequential", 40.0),
        ("hf-static-cache", "hf-static-cache", 80.0),
    )
    options = {"hf-sequential": {}, "hf-static-cache": {"compile_backend": "aot_eager"}}
    spec = sweep_spec(BASELINES_CONCURRENCY, name="every HF baseline")
    spec["backends"] = [
        *(
            {"kind": kind, "name": name, "num_prompts": 4} | options[kind]
            for name, kind, _ in single
        ),
        {"kind": "hf-batched"},
        {"kind": "transformers-serve", "name": "ts-cb", "cb_num_blocks": 64},
        {"kind": "vllm"},
        *([{"kind": "vllm", "name": "vllm-eager", "enforce_eager": True}] if eager else []),
    ]
    run = intake.create_run(owner, spec, "baselines")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    environment.store_environment(run, snapshot(), "f" * 64)
    for name, kind, throughput in single:
        m = hf_measurement(throughput)
        update = {"backend": name, "backend_kind": kind, "commands": {}}
        ingestion.ingest_measurement(run, m.model_copy(update=update))
    base, rng = recording(), random.Random(1)
    for c in BASELINES_CONCURRENCY:
        m = vllm_measurement("concurrency", "max_concurrency", c, scaled_point(base, c, rng))
        ingestion.ingest_measurement(run, m)
        if eager:
            half = m.metrics["output_throughput"] / 2
            update = {"backend": "vllm-eager", "metrics": {**m.metrics, "output_throughput": half}}
            ingestion.ingest_measurement(run, m.model_copy(update=update))
        for backend, kind, per_request in (
            ("hf-batched", "hf-batched", 50.0),
            ("ts-cb", "transformers-serve", 100.0),
        ):
            update = {
                "backend": backend,
                "backend_kind": kind,
                "metrics": {**m.metrics, "output_throughput": per_request * c},
                "commands": {},
            }
            ingestion.ingest_measurement(run, m.model_copy(update=update))
    ingestion.ingest_event(run, rr.Event(type="finished", status="succeeded", errors=[]))
    run.refresh_from_db()
    return run
