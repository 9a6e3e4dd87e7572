"""The environment's facts as people read them: one table of label and snapshot path.

``runners.environment.capture()`` writes a nested snapshot; pages, the compare
environment diff and the CLI name its facts with these labels, in this order. Each fact
says where it is shown:

- ``compared``: in the environment diff of a comparison (software and hardware that can
  change a number; per-run noise such as the host name is left out);
- ``shown``: among the facts a run page lists first (the rest is in the JSON).

Pure Python: no Django, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fact:
    label: str
    path: str  # dotted path in the snapshot ("software.vllm")
    compared: bool = True
    shown: bool = True


FACTS: tuple[Fact, ...] = (
    Fact("GPU", "gpu.model"),
    Fact("GPU count", "gpu.count"),
    Fact("GPU memory (MiB)", "gpu.memory_total_mib"),
    Fact("Driver", "gpu.driver_version"),
    Fact("CUDA (driver)", "gpu.cuda_driver_version"),
    Fact("CUDA (runtime)", "software.cuda_runtime"),
    Fact("vLLM", "software.vllm"),
    Fact("PyTorch", "software.torch"),
    Fact("Transformers", "software.transformers"),
    Fact("Triton", "software.triton", shown=False),
    Fact("FlashInfer", "software.flashinfer", shown=False),
    Fact("NCCL", "software.nccl", shown=False),
    Fact("Python", "software.python"),
    Fact("Model", "model.id", compared=False),
    Fact("Model revision", "model.revision"),
    Fact("Revision source", "model.revision_source", compared=False),
    Fact("dtype", "benchmark.dtype", compared=False),
    Fact("Max model length", "benchmark.max_model_len", compared=False),
    Fact("Prompt tokens", "benchmark.input_len", compared=False),
    Fact("Output tokens", "benchmark.output_len", compared=False),
    Fact("ignore-eos", "benchmark.ignore_eos", compared=False),
    Fact("Concurrency", "benchmark.concurrency", compared=False),
    Fact("Arrivals", "benchmark.arrival", compared=False),
    Fact("Warm-ups", "benchmark.warmups", compared=False),
    Fact("Host", "host.hostname", compared=False),
    Fact("OS", "host.os", compared=False),
    Fact("Kernel", "host.kernel", compared=False),
    Fact("CPU", "host.cpu_model", compared=False),
    Fact("CPU count", "host.cpu_count", compared=False),
    Fact("Cores (server, client)", "host.core_split", compared=False),
    Fact("Kubernetes node", "kubernetes.node", compared=False),
    Fact("Kubernetes pod", "kubernetes.pod", compared=False),
    Fact("Image", "container.image"),
    Fact("Image digest", "container.image_digest"),
    Fact("Runner version", "runner_version", shown=False),
)
COMPARED: tuple[Fact, ...] = tuple(f for f in FACTS if f.compared)
SHOWN: tuple[Fact, ...] = tuple(f for f in FACTS if f.shown)


def lookup(snapshot: Mapping[str, Any] | None, path: str) -> Any:
    """The value at a dotted ``path`` of a snapshot, or None."""
    node: Any = snapshot or {}
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def text(value: Any) -> str:
    """A fact's value as one line: lists joined, mappings as key=value."""
    if value is None:
        return "—"
    if isinstance(value, list):
        return ", ".join(text(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={text(v)}" for k, v in value.items())
    return str(value)


def facts(
    snapshot: Mapping[str, Any] | None, which: tuple[Fact, ...] = SHOWN
) -> list[tuple[str, str]]:
    """(label, value) of the facts in ``which`` that the snapshot has, in table order."""
    out = []
    for fact in which:
        value = lookup(snapshot, fact.path)
        if value is not None:
            out.append((fact.label, text(value)))
    return out
