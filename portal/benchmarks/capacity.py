"""Capacity planning from the seed's arithmetic: KV-cache bytes, cache-limited concurrency,
where throughput flattened, and how close decode came to the memory-bandwidth roofline.

KV cache per token = 2 (K and V) x layers x KV heads x head dim x bytes per element.
The seed's worked example: 32 layers, 8 KV heads, head dim 128, bf16 -> 131,072 bytes per
token, so 8,192 tokens of context take 1 GiB. A request holds (prompt + output) tokens
at its end; the cache divided by that is how many requests fit at once.

The cache size comes from the best source the run has, and ``CacheSize.source`` says
which: vLLM's own report (``kv_cache_tokens``, ``num_gpu_blocks`` x ``block_size`` or
``kv_cache_bytes`` in the server metrics or client output, where a runner records them),
``VLLM_CPU_KVCACHE_SPACE`` for vLLM's CPU backend, else an estimate: GPU memory x
gpu_memory_utilization - the weights (activations and CUDA graphs are left out, so it
errs high).

Decode roofline (an estimate, and the page says so): each decode step reads every weight
once plus the KV cache of every sequence in the batch. Bytes per step x steps per second
(batch / TPOT tokens per second, i.e. 1 / TPOT steps) against the HBM bandwidth of the
server's GPUs is the fraction reached. The batch is the one the server measured (mean
``num_requests_running`` while requests ran, ``running_batch`` in the curve), assumed from
the client's concurrency only where none was reported (``runners.roofline``). Only for
GPUs in ``GPUS``; "n/a" on a CPU or an unknown GPU.

A server's GPUs are the spec's rule (``runners.spec.VLLMBackend.gpus_per_server``:
tensor x pipeline x data parallel, ``ServerGPUs``): the memory and the bandwidth are
theirs, and each data-parallel replica holds (and each step reads) the weights once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runners import spec as rs

# The GPU table and the roofline arithmetic live with the runner, which computes them too
# (python -m runners gpu-check); re-exported here for the portal.
from runners.roofline import (  # noqa: F401
    GPU,
    GPUS,
    RooflinePoint,
    decode_roofline,
    kv_bytes_per_token,
    lookup_gpu,
)
from runners.roofline import normalise as _normalise

GIB = 2**30

DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "int8": 1,
}
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
FLATTEN_GAIN = 0.10  # throughput "flattened" at the first point gaining less than this


# --------------------------------------------------------------------------- KV cache


def dtype_bytes(*candidates: Any) -> int | None:
    """Bytes per element of the first known dtype name among ``candidates`` ('auto',
    None and unknown names are skipped)."""
    for value in candidates:
        if isinstance(value, str):
            size = DTYPE_BYTES.get(value.lower().removeprefix("torch."))
            if size:
                return size
    return None


@dataclass(frozen=True)
class ModelShape:
    """What the arithmetic needs from a model config (runners.environment.config_summary)."""

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int | None = None
    heads: int | None = None
    intermediate: int | None = None
    vocab: int | None = None
    tied: bool = False
    experts: int | None = None
    dtype: str | None = None
    mla: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> ModelShape | None:
        if not isinstance(config, Mapping):
            return None
        layers = _int(config.get("num_hidden_layers"))
        heads = _int(config.get("num_attention_heads"))
        kv_heads = _int(config.get("num_key_value_heads")) or heads
        hidden = _int(config.get("hidden_size"))
        head_dim = _int(config.get("head_dim")) or (hidden // heads if hidden and heads else None)
        if not layers or not kv_heads or not head_dim:
            return None
        return cls(
            layers=layers,
            kv_heads=kv_heads,
            head_dim=head_dim,
            hidden=hidden,
            heads=heads,
            intermediate=_int(config.get("intermediate_size")),
            vocab=_int(config.get("vocab_size")),
            tied=bool(config.get("tie_word_embeddings")),
            experts=_int(config.get("num_experts")),
            dtype=config.get("dtype") if isinstance(config.get("dtype"), str) else None,
            mla=config.get("kv_lora_rank") is not None,
        )

    def parameters(self) -> int | None:
        """Parameter count estimate: embeddings, attention, gated MLP (every expert)."""
        if not (self.hidden and self.heads and self.intermediate and self.vocab):
            return None
        embed = self.vocab * self.hidden * (1 if self.tied else 2)
        attention = 2 * self.hidden * self.heads * self.head_dim  # q and o
        attention += 2 * self.hidden * self.kv_heads * self.head_dim  # k and v
        mlp = 3 * self.hidden * self.intermediate * (self.experts or 1)
        return embed + self.layers * (attention + mlp)


@dataclass
class CacheSize:
    """How much KV cache the server had, and where that number came from."""

    bytes: int | None
    source: str
    estimated: bool = False


@dataclass
class CapacityPlan:
    """Everything the run page's capacity panel shows; ``None`` fields are unknown."""

    kv_bytes_per_token: int | None = None
    kv_dtype: str = ""
    request_tokens: int | None = None
    kv_bytes_per_request: int | None = None
    cache: CacheSize | None = None
    cache_limited_concurrency: int | None = None
    weights_bytes: int | None = None
    flattened_at: float | None = None
    preemptions_from: float | None = None
    gpu: GPU | None = None
    roofline: list[RooflinePoint] = field(default_factory=list)
    roofline_note: str = ""
    roofline_gpus: int = 1  # the GPUs whose bandwidth the roofline adds up (tp x pp x dp)
    notes: list[str] = field(default_factory=list)

    @property
    def best_roofline(self) -> RooflinePoint | None:
        return max(self.roofline, key=lambda r: r.fraction, default=None)


# --------------------------------------------------------------------------- sources

_REPORTED_TOKENS = ("kv_cache_tokens", "kv_cache_capacity_tokens", "gpu_kv_cache_tokens")
_REPORTED_BYTES = ("kv_cache_bytes", "kv_cache_size_bytes", "kv_cache_memory_bytes")


def reported_cache(
    sources: Sequence[Mapping[str, Any] | None], bytes_per_token: int | None
) -> CacheSize | None:
    """vLLM's own KV-cache size from server metrics or client output, if any carries it."""
    for data in sources:
        if not isinstance(data, Mapping):
            continue
        for key in _REPORTED_BYTES:
            value = _num(data.get(key))
            if value:
                return CacheSize(int(value), f"reported by vLLM ({key})")
        if bytes_per_token:
            for key in _REPORTED_TOKENS:
                value = _num(data.get(key))
                if value:
                    return CacheSize(
                        int(value * bytes_per_token), f"reported by vLLM ({key}: {value:,.0f})"
                    )
            blocks = _num(data.get("num_gpu_blocks"))
            if blocks:
                block_size = _num(data.get("block_size")) or 16
                tokens = blocks * block_size
                return CacheSize(
                    int(tokens * bytes_per_token),
                    f"reported by vLLM ({blocks:,.0f} blocks x {block_size:g} tokens)",
                )
    return None


@dataclass(frozen=True)
class ServerGPUs:
    """The GPUs one server of a vLLM backend spans and how many copies of the weights
    they hold: ``gpus`` is ``runners.spec.VLLMBackend.gpus_per_server`` (tensor x pipeline
    x data parallel), ``replicas`` the data-parallel size (each replica holds the weights
    once, split over its tensor x pipeline GPUs)."""

    gpus: int = 1
    replicas: int = 1

    @classmethod
    def of(cls, backend: Mapping[str, Any]) -> ServerGPUs:
        """From a stored spec's vLLM backend (read as a stored spec is: ``stored``)."""
        if not backend:
            return cls()
        parsed = rs.VLLMBackend.model_validate(backend, context={"stored": True})
        replicas = rs.parallel_size(parsed.extra_args, "--data-parallel-size")
        return cls(parsed.gpus_per_server, replicas)


def estimated_cache(
    snapshot: Mapping[str, Any],
    backend: Mapping[str, Any],
    weights_bytes: int | None,
) -> CacheSize | None:
    """VLLM_CPU_KVCACHE_SPACE on CPU, else the server's GPUs' memory x utilization - the
    weights (once per data-parallel replica)."""
    env = snapshot.get("env") if isinstance(snapshot.get("env"), Mapping) else {}
    gpu = snapshot.get("gpu") if isinstance(snapshot.get("gpu"), Mapping) else {}
    count = _int(gpu.get("count")) or 0
    cpu_space = _num(env.get("VLLM_CPU_KVCACHE_SPACE"))
    if count == 0:
        if cpu_space:
            return CacheSize(
                int(cpu_space * GIB), f"VLLM_CPU_KVCACHE_SPACE={cpu_space:g} GiB (vLLM on CPU)"
            )
        return None
    memory_mib = _num(gpu.get("memory_total_mib"))
    if not memory_mib:
        return None
    if weights_bytes is None:
        return None
    utilization = _num(backend.get("gpu_memory_utilization")) or DEFAULT_GPU_MEMORY_UTILIZATION
    server = ServerGPUs.of(backend)
    total = memory_mib * 2**20 * server.gpus
    free = total * utilization - weights_bytes * server.replicas
    if free <= 0:
        return CacheSize(0, "estimate: the weights fill the memory vLLM may use", estimated=True)
    copies = f" x {server.replicas} data-parallel replicas" if server.replicas > 1 else ""
    return CacheSize(
        int(free),
        f"estimate: {server.gpus} x {memory_mib / 1024:.0f} GiB x gpu_memory_utilization "
        f"{utilization:g} - {weights_bytes / GIB:.1f} GiB weights{copies} (activations not "
        "counted)",
        estimated=True,
    )


# --------------------------------------------------------------------------- curve facts


def flattened_at(xs: Sequence[float], ys: Sequence[float | None]) -> float | None:
    """The first point whose throughput gained less than FLATTEN_GAIN over the previous."""
    prev: float | None = None
    for x, y in zip(xs, ys, strict=False):
        if y is None:
            continue
        if prev is not None and prev > 0 and (y - prev) / prev < FLATTEN_GAIN:
            return x
        prev = y
    return None


def preemptions_from(xs: Sequence[float], preemptions: Sequence[float | None]) -> float | None:
    """The first point where the server preempted sequences (cache full)."""
    for x, count in zip(xs, preemptions, strict=False):
        if count is not None and count > 0:
            return x
    return None


# --------------------------------------------------------------------------- the plan


def plan(
    spec: Mapping[str, Any],
    snapshot: Mapping[str, Any] | None,
    curve: Sequence[Mapping[str, Any]] = (),
    reported: Sequence[Mapping[str, Any] | None] = (),
    gpu_name: str = "",
) -> CapacityPlan:
    """The capacity panel for a run.

    ``spec``: the run's spec (JSON). ``snapshot``: its environment (None before the
    runner reported). ``curve``: the first vLLM backend's concurrency-sweep points,
    sorted, each a mapping with x, concurrency, num_prompts, input_len, output_len,
    output_throughput, preemptions, mean_tpot_ms and (where measured) running_batch.
    ``reported``: server metrics / client output mappings that may carry vLLM's KV-cache
    size.
    """
    snapshot = snapshot or {}
    out = CapacityPlan()
    model = spec.get("model") or {}
    workload = spec.get("workload") or {}
    backend = next((b for b in spec.get("backends") or [] if b.get("kind") == "vllm"), {})
    config = (snapshot.get("model") or {}).get("config") if snapshot else None
    shape = ModelShape.from_config(config)

    xs = [float(p["x"]) for p in curve]
    out.flattened_at = flattened_at(xs, [_num(p.get("output_throughput")) for p in curve])
    out.preemptions_from = preemptions_from(xs, [_num(p.get("preemptions")) for p in curve])

    if shape is None:
        out.notes.append(
            "The model's config (layers, KV heads, head dim) was not captured, so the KV "
            "arithmetic cannot be done for this run."
        )
        return out
    if shape.mla:
        out.notes.append(
            "This model compresses its KV cache (MLA); the per-token size below is the "
            "uncompressed upper bound."
        )
    kv_dtype = str(backend.get("kv_cache_dtype") or "auto")
    size = (
        dtype_bytes(kv_dtype)
        if kv_dtype != "auto"
        else dtype_bytes(model.get("dtype"), shape.dtype, "bfloat16")
    )
    out.kv_dtype = kv_dtype if kv_dtype != "auto" else f"auto ({model.get('dtype') or shape.dtype})"
    out.kv_bytes_per_token = kv_bytes_per_token(
        shape.layers, shape.kv_heads, shape.head_dim, size or 2
    )
    first = curve[0] if curve else None
    input_len = int(first["input_len"]) if first else _int(workload.get("input_len")) or 0
    output_len = int(first["output_len"]) if first else _int(workload.get("output_len")) or 0
    out.request_tokens = input_len + output_len + (_int(workload.get("prefix_len")) or 0)
    out.kv_bytes_per_request = out.kv_bytes_per_token * out.request_tokens

    params = shape.parameters()
    weight_size = dtype_bytes(model.get("dtype"), shape.dtype, "bfloat16") or 2
    if params and not backend.get("quantization"):
        out.weights_bytes = params * weight_size
    elif backend.get("quantization"):
        out.notes.append("Quantized weights: their size is not estimated.")

    out.cache = reported_cache(reported, out.kv_bytes_per_token) or estimated_cache(
        snapshot, backend, out.weights_bytes
    )
    if out.cache is not None and out.cache.bytes is not None and out.kv_bytes_per_request:
        out.cache_limited_concurrency = out.cache.bytes // out.kv_bytes_per_request

    gpu_info = snapshot.get("gpu") if isinstance(snapshot.get("gpu"), Mapping) else {}
    count = _int(gpu_info.get("count")) or 0
    name = str(gpu_info.get("model") or gpu_name or "")
    if count == 0 or _normalise(name) in ("CPU", "NONE", ""):
        out.roofline_note = "n/a on CPU: the roofline is for GPUs with a known HBM bandwidth."
        return out
    out.gpu = lookup_gpu(name, gpu_info.get("memory_total_mib"))
    if out.gpu is None:
        out.roofline_note = f"n/a: unknown GPU {name!r} (not in the bandwidth table)."
    elif out.weights_bytes is None:
        out.roofline_note = "n/a: the weights' size could not be estimated."
    else:
        # Every GPU of the server reads at once; each data-parallel replica reads the
        # weights in each of its steps.
        server = ServerGPUs.of(backend)
        out.roofline_gpus = server.gpus
        out.roofline = decode_roofline(
            out.gpu,
            server.gpus,
            out.weights_bytes * server.replicas,
            out.kv_bytes_per_token,
            curve,
        )
        if not out.roofline:
            out.roofline_note = "n/a: no point reported a TPOT."
    return out


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
