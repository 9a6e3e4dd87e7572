"""The GPU table and the decode roofline: pure arithmetic the runner and the portal share.

``runners`` never imports the portal, so what both need lives here: the portal's capacity
panel (``portal.benchmarks.capacity``) and ``python -m runners gpu-check`` compute the
fraction of the memory-bandwidth roofline that decode reached with the same functions.

Decode roofline, an **estimate**: each decode step reads every weight once plus the KV
cache of every sequence in the batch. Bytes per step x steps per second (1 / TPOT)
against the HBM bandwidth of every GPU the server spans is the fraction reached. Only
for GPUs in ``GPUS``. What it assumes, and where the inputs come from:

- **the batch** is the one measured: the mean of vLLM's ``num_requests_running`` over
  the point's busy samples (``running_batch``, ``runners.server_metrics``); only where a
  point has no such samples (an HF baseline, an endpoint without ``/metrics``) is it
  taken as ``min(concurrency, num_prompts)``, and ``batch_source`` says "assumed";
- **the GPUs** are tensor x pipeline x data parallel (``gpus``): their bandwidths add up,
  and each data-parallel replica reads its own copy of the weights (the caller passes
  the weights once per replica);
- the context of a sequence is its prompt plus half its output (the mean over decode);
- activations, CUDA graphs and prefill are not counted, so it errs low.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GPU:
    """Vendor datasheet figures: memory, HBM/GDDR bandwidth, dense bf16 tensor peak."""

    key: str
    name: str
    memory_gb: float
    bandwidth_gbs: float
    bf16_tflops: float | None
    pattern: str
    note: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)


# Order matters: the first pattern that matches the normalised name wins, so specific
# variants (A100 80GB, H100 PCIe) come before their families.
GPUS: tuple[GPU, ...] = (
    GPU("B200", "NVIDIA B200", 180, 8000, 2250, r"B200"),
    GPU("GH200", "NVIDIA GH200 (96 GB)", 96, 4000, 989, r"GH200"),
    GPU("H200", "NVIDIA H200", 141, 4800, 989, r"H200"),
    GPU("H100-NVL", "NVIDIA H100 NVL", 94, 3900, 835, r"H100.*NVL"),
    GPU("H100-PCIe", "NVIDIA H100 PCIe", 80, 2000, 756, r"H100.*PCIE"),
    GPU("H100-SXM", "NVIDIA H100 SXM", 80, 3350, 989, r"H100"),
    GPU("A100-80GB-PCIe", "NVIDIA A100 80GB PCIe", 80, 1935, 312, r"A100.*80.*PCIE|A100.*PCIE.*80"),
    GPU("A100-80GB", "NVIDIA A100 80GB SXM", 80, 2039, 312, r"A100.*80"),
    GPU("A100-40GB", "NVIDIA A100 40GB", 40, 1555, 312, r"A100"),
    GPU("L40S", "NVIDIA L40S", 48, 864, 362, r"L40S"),
    GPU("L40", "NVIDIA L40", 48, 864, 181, r"L40"),
    GPU("L4", "NVIDIA L4", 24, 300, 121, r"(^| )L4( |$)"),
    GPU("A10G", "NVIDIA A10G", 24, 600, 70, r"A10G"),
    GPU("A10", "NVIDIA A10", 24, 600, 125, r"(^| )A10( |$)"),
    GPU("A40", "NVIDIA A40", 48, 696, 150, r"A40"),
    GPU("V100", "NVIDIA V100", 32, 900, None, r"V100", "no bf16 (fp16 tensor 125 TFLOPS)"),
    GPU("T4", "NVIDIA T4", 16, 320, None, r"(^| )T4( |$)", "no bf16 (fp16 65)"),
)


def normalise(name: str) -> str:
    """Upper case, "-" and "_" as spaces, single spaces: how GPU names are matched."""
    return re.sub(r"\s+", " ", name.upper().replace("_", " ").replace("-", " ")).strip()


def lookup_gpu(name: str | None, memory_mib: Any = None) -> GPU | None:
    """The table entry for a GPU name as nvidia-smi or a spec writes it, else None.

    "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L4", "H100-80GB"... An A100
    without a size in its name is told apart by its memory.
    """
    if not name:
        return None
    text = normalise(name)
    if text in ("CPU", "NONE", "UNKNOWN"):
        return None
    big = isinstance(memory_mib, int | float) and memory_mib > 60 * 1024
    if "A100" in text and "80" not in text and big:
        text += " 80GB"
    for gpu in GPUS:
        if re.search(gpu.pattern, text):
            return gpu
    return None


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """2 (K and V) x layers x KV heads x head dim x bytes per element."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


@dataclass
class RooflinePoint:
    x: float
    batch: float
    bytes_per_step: float
    achieved_gbs: float
    fraction: float
    batch_source: str = "assumed"  # "measured" (num_requests_running) or "assumed"


def decode_roofline(
    gpu: GPU,
    gpus: int,
    weights_bytes: int,
    bytes_per_token: int,
    points: Sequence[Mapping[str, Any]],
) -> list[RooflinePoint]:
    """Fraction of HBM bandwidth per point: (weights + batch x context x KV/token) per
    step, at 1 / TPOT steps per second, against ``gpus`` x the GPU's bandwidth.
    ``points``: x, concurrency, num_prompts, input_len, output_len, mean_tpot_ms, and
    ``running_batch`` where measured (module docstring)."""
    out = []
    bandwidth = gpu.bandwidth_gbs * 1e9 * max(gpus, 1)
    for p in points:
        tpot_ms = _num(p.get("mean_tpot_ms"))
        if not tpot_ms or tpot_ms <= 0:
            continue
        measured = _num(p.get("running_batch"))
        if measured is not None and measured > 0:
            batch, source = max(1.0, measured), "measured"
        else:
            batch, source = (
                float(max(1, min(int(p["concurrency"]), int(p["num_prompts"])))),
                "assumed",
            )
        context = int(p["input_len"]) + int(p["output_len"]) / 2
        step_bytes = weights_bytes + batch * context * bytes_per_token
        achieved = step_bytes / (tpot_ms / 1000.0)
        out.append(
            RooflinePoint(
                x=float(p["x"]),
                batch=batch,
                bytes_per_step=step_bytes,
                achieved_gbs=achieved / 1e9,
                fraction=achieved / bandwidth,
                batch_source=source,
            )
        )
    return out


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
