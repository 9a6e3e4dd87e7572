"""Turn stored runs, measurements and environments into what the pages display."""

from __future__ import annotations

import shlex
from typing import Any

from portal.benchmarks.models import Environment, Measurement, Run
from portal.benchmarks.points import RunResults
from runners.environment import get as env_get


def summary(results: RunResults) -> dict[str, Any]:
    """Headline numbers: best vLLM output tok/s (where, and its p99 TTFT), the HF
    baseline, and their ratio."""
    points = results.points
    out: dict[str, Any] = {
        "points": len(points),
        "failed": sum(p.failed for p in points),
    }
    vllm = [
        p for p in points if p.backend_kind == "vllm" and p.get("output_throughput") is not None
    ]
    if vllm:
        best = max(vllm, key=lambda p: p.get("output_throughput") or 0.0)
        out["best"] = {
            "output_throughput": best.get("output_throughput"),
            "where": best.short,
            "backend": best.backend,
            "p99_ttft_ms": best.get("p99_ttft_ms"),
            "point": best,
        }
    base = next(iter(results.baselines.values()), None)
    if base is not None and base.get("output_throughput"):
        out["hf_output_throughput"] = base.get("output_throughput")
    if "best" in out and out.get("hf_output_throughput"):
        out["speedup"] = out["best"]["output_throughput"] / out["hf_output_throughput"]
    return out


def environment_of(run: Run) -> Environment | None:
    try:
        return run.environment
    except Environment.DoesNotExist:
        return None


ENV_FACTS = [
    ("GPU", "gpu.model"),
    ("GPU count", "gpu.count"),
    ("GPU memory (MiB)", "gpu.memory_total_mib"),
    ("Driver", "gpu.driver_version"),
    ("CUDA (driver)", "gpu.cuda_driver_version"),
    ("CUDA (runtime)", "software.cuda_runtime"),
    ("vLLM", "software.vllm"),
    ("PyTorch", "software.torch"),
    ("Transformers", "software.transformers"),
    ("Python", "software.python"),
    ("Model", "model.id"),
    ("Model revision", "model.revision"),
    ("Revision source", "model.revision_source"),
    ("dtype", "benchmark.dtype"),
    ("Max model length", "benchmark.max_model_len"),
    ("Prompt tokens", "benchmark.input_len"),
    ("Output tokens", "benchmark.output_len"),
    ("ignore-eos", "benchmark.ignore_eos"),
    ("Concurrency", "benchmark.concurrency"),
    ("Arrivals", "benchmark.arrival"),
    ("Warm-ups", "benchmark.warmups"),
    ("Host", "host.hostname"),
    ("OS", "host.os"),
    ("Kernel", "host.kernel"),
    ("CPU", "host.cpu_model"),
    ("CPU count", "host.cpu_count"),
    ("Kubernetes node", "kubernetes.node"),
    ("Kubernetes pod", "kubernetes.pod"),
    ("Image", "container.image"),
    ("Image digest", "container.image_digest"),
]


def _display(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(_display(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_display(v)}" for k, v in value.items())
    return str(value)


def environment_facts(snapshot: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the facts a reader checks first; the rest is in the JSON."""
    facts = []
    for label, path in ENV_FACTS:
        value = env_get(snapshot, path)
        if value is not None:
            facts.append((label, _display(value)))
    return facts


_ABSENT = {"", "none", "unknown"}


def _known(value: Any) -> str:
    text = "" if value is None else str(value)
    return "" if text.strip().lower() in _ABSENT else text


def reproduce_commands(run: Run, snapshot: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything needed to run it again: the runner command for the whole spec (and in
    the image it ran in), per point the exact vLLM commands, the HF baseline command, the
    image and digest, and the package list. One query (the commands of repeat 0)."""
    snapshot = snapshot or {}
    per_point: dict[str, dict[str, str]] = {}
    hf: dict[str, str] = {}
    rows = (
        Measurement.objects.filter(run=run, repeat=0)
        .order_by("backend", "sweep", "value")
        .values_list("backend", "backend_kind", "point_key", "commands")
    )
    for backend, kind, point_key, commands in rows:
        if not commands:
            continue
        if kind == "hf-sequential":
            hf[backend] = commands.get("hf", "")
        else:
            per_point[f"{backend} {point_key}"] = commands
    spec_file = f"servebench-{run.short_id}-spec.yaml"
    runner = f"python -m runners run {spec_file} --out result.json"
    image = _known(env_get(snapshot, "container.image"))
    digest = _known(env_get(snapshot, "container.image_digest"))
    container = ""
    if image:
        ref = f"{image.split('@')[0]}@{digest}" if digest.startswith("sha256:") else image
        # The runner image's ENTRYPOINT is `python -m runners`; --init reaps vLLM's engine
        # processes. The reference is runner-reported text: quoted, since people paste it.
        container = (
            'docker run --rm --init --gpus all -v "$PWD:/work" -w /work '
            f"{shlex.quote(ref)} run {spec_file} --out result.json"
        )
    packages = env_get(snapshot, "packages")
    package_list = (
        "\n".join(f"{name}=={version}" for name, version in sorted(packages.items()))
        if isinstance(packages, dict)
        else ""
    )
    return {
        "runner": runner,
        "container": container,
        "image": image,
        "digest": digest,
        "points": per_point,
        "hf": hf,
        "packages": package_list,
        "package_count": len(packages) if isinstance(packages, dict) else 0,
    }
