"""Turn stored runs, measurements and environments into what the pages display."""

from __future__ import annotations

from typing import Any

from portal.benchmarks.models import Environment, Measurement, Run


def chart_row(m: Measurement) -> dict[str, Any]:
    """The plain mapping ``portal.web.figures`` takes."""
    return {
        "backend": m.backend,
        "backend_kind": m.backend_kind,
        "sweep": m.sweep,
        "axis": m.axis or None,
        "value": m.value,
        "repeat": m.repeat,
        "status": m.status,
        "metrics": m.metrics or {},
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Headline numbers: best vLLM output tok/s, the HF baseline, and their ratio."""
    ok = [r for r in rows if r["status"] == "succeeded" and r["metrics"]]
    vllm = [r for r in ok if r["backend_kind"] == "vllm" and "output_throughput" in r["metrics"]]
    hf = [r for r in ok if r["backend_kind"] == "hf-sequential"]
    out: dict[str, Any] = {
        "measurements": len(rows),
        "failed": sum(1 for r in rows if r["status"] == "failed"),
    }
    if vllm:
        best = max(vllm, key=lambda r: r["metrics"]["output_throughput"])
        out["best"] = {
            "output_throughput": best["metrics"]["output_throughput"],
            "where": f"{best['sweep']} {best['axis']}={_num(best['value'])}"
            if best["axis"]
            else best["sweep"],
            "backend": best["backend"],
            "p99_ttft_ms": best["metrics"].get("p99_ttft_ms"),
        }
    if hf:
        values = [
            r["metrics"]["output_throughput"] for r in hf if "output_throughput" in r["metrics"]
        ]
        if values:
            out["hf_output_throughput"] = sum(values) / len(values)
    if "best" in out and out.get("hf_output_throughput"):
        out["speedup"] = out["best"]["output_throughput"] / out["hf_output_throughput"]
    return out


def _num(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def environment_of(run: Run) -> Environment | None:
    try:
        return run.environment
    except Environment.DoesNotExist:
        return None


def _get(snapshot: dict[str, Any], dotted: str) -> Any:
    node: Any = snapshot
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


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
        value = _get(snapshot, path)
        if value is not None:
            facts.append((label, _display(value)))
    return facts


def reproduce_commands(run: Run) -> dict[str, Any]:
    """The runner command for the whole spec, and per point the exact vLLM commands."""
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
    return {
        "runner": f"python -m runners run servebench-{run.short_id}-spec.yaml --out result.json",
        "points": per_point,
        "hf": hf,
    }
