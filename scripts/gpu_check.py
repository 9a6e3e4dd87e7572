"""``make gpu-check``: what servebench measures on this machine's NVIDIA GPU, beside
published numbers, in one command (about five minutes on a data-centre GPU).

1. **A GPU?** NVML must read at least one GPU under this process's
   ``CUDA_VISIBLE_DEVICES`` and PyTorch must see CUDA. Where either is missing it says
   which, what to do, and exits 2 without running anything.
2. **The node self-test**: ``python -m runners gpu-check --require-gpu`` (NVML readings
   of every field, the environment a run records, the HF sequential baseline on a
   Qwen3-0.6B-shaped model with random weights built offline, the roofline at batch 1),
   with ``--record``: the raw NVML readings around the baseline, in the format
   ``tests/runners/nvmlreplay.py`` replays (commit it to replace the synthetic one).
3. **The baselines as a run measures them**: ``python -m runners run`` on a spec
   (``build_spec``) with ``hf-sequential`` and ``hf-batched`` (and ``vllm`` where it is
   installed) at concurrency 1 and 4, 512 prompt / 128 output tokens, on that model.
4. **The table** (``rows``, ``table``): per backend and concurrency, output tok/s, mean
   TPOT, mean GPU power, J per output token (the run's own energy: NVML's counter, or
   its power samples integrated where a GPU has no counter) and the decode roofline
   fraction (``runners.roofline``, an estimate: weights + batch x context x KV bytes per
   step, 1 / TPOT steps a second, against the datasheet bandwidth of the GPUs used; the
   batch the server measured where it reported one). Then ``ANCHORS``, published numbers
   for the same model at the same point, beside ours (``anchor_lines``).

Everything goes to ``--out DIR`` (default ``$SERVEBENCH_CACHE/gpu-check/<UTC time>``):
``gpu-check.json``, ``nvml-recording.json``, ``spec.json``, ``result.json``, the logs.

Exit codes: 0 every step passed; 1 a step failed (its log is named); 2 no usable GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file (make gpu-check): the repo's packages
    sys.path.insert(0, str(ROOT))

from runners import nvml, roofline, tiny_model  # noqa: E402

NO_GPU = 2
CONCURRENCY = (1, 4)
INPUT_LEN, OUTPUT_LEN, PROMPTS = 512, 128, 32


@dataclass(frozen=True)
class Anchor:
    """A published number for Qwen3-0.6B: where (GPU family, backend, concurrency), what
    (a metric key of ours), its value and unit, and who measured it how."""

    gpu: str  # a runners.roofline GPUS key prefix: "H100", "A100"
    backend: str
    concurrency: int
    metric: str
    value: float
    unit: str
    source: str


# From issue 28's reference measurements (Qwen3-0.6B, bf16).
ANCHORS: tuple[Anchor, ...] = (
    Anchor("H100", "vllm", 4, "avg_power_w", 349.0, "W", "1x H100, vLLM, DCGM power"),
    Anchor("A100", "vllm", 1, "mean_tpot_ms", 4.2, "ms", "1x A100, vLLM, mean TPOT"),
)


@dataclass(frozen=True)
class Row:
    """One measured point, and what is derived from it."""

    backend: str
    concurrency: int
    output_tok_s: float | None
    mean_tpot_ms: float | None
    avg_power_w: float | None
    j_per_token: float | None
    roofline_fraction: float | None
    batch: float | None
    batch_source: str


# --------------------------------------------------------------------------- step 1


def find_gpu(lib: Any = None) -> tuple[list[str], str]:
    """(names of the GPUs NVML reads under CUDA_VISIBLE_DEVICES, why not: "" when some
    are and PyTorch sees CUDA)."""
    try:
        gpus = nvml.GPUs.open(lib, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except nvml.NVMLUnavailable as exc:
        return [], f"NVML cannot read a GPU here: {exc}"
    names = [d.name for d in gpus.devices]
    gpus.close()
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
        build = torch.__version__
    except ImportError:
        return names, "PyTorch is not installed"
    if not cuda:
        return names, f"NVML reads {', '.join(names)}, but PyTorch {build} sees no CUDA device"
    return names, ""


def no_gpu_message(why: str) -> str:
    return (
        f"gpu-check: no usable NVIDIA GPU on this machine ({why}).\n"
        "What to do: run `make gpu-check` on a machine with an NVIDIA GPU, where\n"
        "  - `nvidia-smi` lists the GPU (the driver is loaded),\n"
        "  - CUDA_VISIBLE_DEVICES, if set, names it (unset it to use every GPU),\n"
        "  - the runner's Python has nvidia-ml-py and a CUDA build of torch "
        "(python -c 'import torch; print(torch.cuda.is_available())' prints True).\n"
        "On Kubernetes, run it in the runner image on a GPU node: see docs/gpu.md."
    )


# --------------------------------------------------------------------------- step 3


def build_spec(model: Path, tokenizer: Path, with_vllm: bool) -> dict[str, Any]:
    """The run of step 3 as a spec (JSON), checked by the runner's own schema."""
    from runners import spec as rs

    backends: list[dict[str, Any]] = [
        {"kind": "hf-sequential", "num_prompts": 8, "num_warmups": 2},
        {"kind": "hf-batched"},
    ]
    if with_vllm:
        backends.append({"kind": "vllm"})
    spec = {
        "name": "gpu-check: Qwen3-0.6B-shaped model, random weights",
        "model": {
            "id": str(model),
            "tokenizer": str(tokenizer),
            "dtype": "bfloat16",
            "max_model_len": 2048,
        },
        "workload": {
            "input_len": INPUT_LEN,
            "output_len": OUTPUT_LEN,
            "num_prompts": PROMPTS,
            "num_warmups": 4,
        },
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [*CONCURRENCY]}],
        "backends": backends,
        "resources": {"gpu_count": 1, "timeout_minutes": 30},
    }
    rs.parse_spec(spec)  # SpecError names the field if this script and the schema disagree
    return spec


# --------------------------------------------------------------------------- step 4


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _config(document: Mapping[str, Any]) -> Mapping[str, Any]:
    model = (document.get("environment") or {}).get("model") or {}
    return model.get("config") or {}


def rows(document: Mapping[str, Any], weights_bytes: int) -> list[Row]:
    """The table of a result document: every succeeded measurement, derived numbers
    computed with the runner's own rules (``runners.roofline``)."""
    gpu_info = (document.get("environment") or {}).get("gpu") or {}
    gpu = roofline.lookup_gpu(str(gpu_info.get("model") or ""), gpu_info.get("memory_total_mib"))
    config = _config(document)
    kv = None
    if config:
        head_dim = config.get("head_dim") or (
            config["hidden_size"] // config["num_attention_heads"]
        )
        kv = roofline.kv_bytes_per_token(
            config["num_hidden_layers"], config["num_key_value_heads"], head_dim, 2
        )
    out = []
    for m in document.get("measurements") or []:
        if m.get("status") != "succeeded":
            continue
        metrics, point = m.get("metrics") or {}, m["point"]
        server = m.get("server_metrics") or {}
        concurrency = int(point["max_concurrency"])
        energy = _num(metrics.get("energy_per_output_token_j"))
        summary = (m.get("telemetry") or {}).get("summary") or {}
        tokens = _num(metrics.get("total_output_tokens"))
        if energy is None and _num(summary.get("energy_j")) and tokens:
            energy = float(summary["energy_j"]) / tokens
        fraction = batch = None
        source = ""
        if gpu is not None and kv is not None:
            found = roofline.decode_roofline(
                gpu,
                1,
                weights_bytes,
                kv,
                [
                    {
                        "x": concurrency,
                        "concurrency": concurrency,
                        "num_prompts": point["num_prompts"],
                        "input_len": point["input_len"],
                        "output_len": point["output_len"],
                        "mean_tpot_ms": metrics.get("mean_tpot_ms"),
                        "running_batch": server.get("num_requests_running_mean"),
                    }
                ],
            )
            if found:
                fraction, batch, source = found[0].fraction, found[0].batch, found[0].batch_source
        out.append(
            Row(
                backend=m["backend"],
                concurrency=concurrency,
                output_tok_s=_num(metrics.get("output_throughput")),
                mean_tpot_ms=_num(metrics.get("mean_tpot_ms")),
                avg_power_w=_num(metrics.get("avg_power_w")) or _num(summary.get("avg_power_w")),
                j_per_token=energy,
                roofline_fraction=fraction,
                batch=batch,
                batch_source=source,
            )
        )
    return sorted(out, key=lambda r: (r.backend, r.concurrency))


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(found: Sequence[Row]) -> str:
    """The rows as a fixed-width table for a terminal."""
    head = (
        f"{'backend':<14} {'conc':>4} {'out tok/s':>10} {'TPOT ms':>8} {'power W':>8} "
        f"{'J/token':>8} {'roofline*':>9}  batch"
    )
    lines = [head, "-" * len(head)]
    for r in found:
        batch = f"{r.batch:g} {r.batch_source}" if r.batch is not None else "-"
        fraction = f"{r.roofline_fraction:.1%}" if r.roofline_fraction is not None else "-"
        lines.append(
            f"{r.backend:<14} {r.concurrency:>4} {_cell(r.output_tok_s, '.1f'):>10} "
            f"{_cell(r.mean_tpot_ms, '.2f'):>8} {_cell(r.avg_power_w, '.0f'):>8} "
            f"{_cell(r.j_per_token, '.3g'):>8} "
            f"{fraction:>9}"
            f"  {batch}"
        )
    lines.append(
        "* decode roofline, an estimate: (weights + batch x context x KV bytes) per step x "
        "1/TPOT, against the GPU's datasheet HBM bandwidth"
    )
    return "\n".join(lines)


def anchor_lines(found: Sequence[Row], gpu_name: str) -> list[str]:
    """Each published anchor beside our number at the same backend and concurrency, and
    whether the GPU is the anchor's (another GPU's number is context, not a target)."""
    gpu = roofline.lookup_gpu(gpu_name)
    lines = []
    for a in ANCHORS:
        ours = next(
            (r for r in found if r.backend == a.backend and r.concurrency == a.concurrency), None
        )
        value = getattr(ours, a.metric, None) if ours is not None else None
        same = gpu is not None and gpu.key.startswith(a.gpu)
        where = "same GPU family" if same else f"this GPU is {gpu_name or 'unknown'}, not {a.gpu}"
        if value is None:
            mine = f"not measured here ({a.backend} at concurrency {a.concurrency} did not run)"
        else:
            ratio = f", {value / a.value:.2f}x the anchor" if same else ""
            mine = f"{value:.3g} {a.unit} here{ratio}"
        lines.append(
            f"{a.source} at concurrency {a.concurrency}: {a.value:g} {a.unit}; {mine} ({where})"
        )
    return lines


# --------------------------------------------------------------------------- the command


def _run(argv: list[str], log: Path) -> int:
    print(f"$ {' '.join(argv)}  (log: {log})", flush=True)
    with log.open("wb") as fh:
        return subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="directory for every file it writes")
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM out of step 3")
    args = parser.parse_args(argv)

    names, why = find_gpu()
    if why:
        print(no_gpu_message(why), file=sys.stderr)
        return NO_GPU
    print(f"gpu-check: {len(names)} GPU(s): {', '.join(names)}", flush=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.out or tiny_model.default_dir().parent / "gpu-check" / stamp
    out.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    env_ok = True

    record = out / "nvml-recording.json"
    check = [python, "-m", "runners", "gpu-check", "--require-gpu", "--record", str(record)]
    code = _run([*check, "--out", str(out / "gpu-check.json")], out / "gpu-check.log")
    print(_tail(out / "gpu-check.log", 8))
    env_ok &= code == 0

    from runners import gpucheck

    model, tokenizer = gpucheck.ensure_model()
    with_vllm = not args.no_vllm and importlib.util.find_spec("vllm") is not None
    spec = build_spec(model, tokenizer, with_vllm)
    (out / "spec.json").write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    result = out / "result.json"
    run = [python, "-m", "runners", "run", str(out / "spec.json"), "--out", str(result)]
    code = _run([*run, "--workdir", str(out / "work")], out / "run.log")
    if code != 0 or not result.exists():
        print(f"gpu-check: the run failed (exit code {code}); last lines of {out / 'run.log'}:")
        print(_tail(out / "run.log"))
        return 1
    document = json.loads(result.read_text())
    found = rows(document, gpucheck.model_bytes(model))
    print()
    print(table(found))
    print()
    print("Published anchors (Qwen3-0.6B):")
    for line in anchor_lines(found, names[0]):
        print(f"  {line}")
    if not with_vllm:
        print("  (vLLM is not installed here: the anchors are vLLM's; install vllm to compare)")
    failed = [
        m["backend"] for m in document.get("measurements") or [] if m["status"] != "succeeded"
    ]
    print(f"\nfiles: {out}")
    print(f"NVML recording: {record} (copy it to tests/runners/data/ to replace the synthetic one)")
    if failed or not env_ok:
        print(f"gpu-check FAILED: {', '.join(failed) or 'the node self-test'} (see the logs)")
        return 1
    print("gpu-check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
