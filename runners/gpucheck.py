"""``python -m runners gpu-check``: a five-minute self-test of a new GPU node.

Each check says ``ok``, ``failed`` or ``skipped`` and why, in this order:

1. **nvml**: NVML readable, the GPUs it sees (name, driver, power limit), and which fields
   each answers (power, the energy counter, utilisation, clocks, memory, temperature,
   throttle reasons). A GPU without the energy counter passes when it reports power:
   energy is then the integral of its power samples (``runners.nvml``, the documented
   fallback); only a GPU with neither fails;
2. **environment**: ``runners.environment.capture``, what a run would record;
3. **hf-baseline**: the HF sequential baseline through the code a run uses (``python -m
   runners hf`` in a child, NVML sampled from here) on a model shaped like Qwen3-0.6B
   (28 layers, hidden 1024, 16 heads, 8 KV heads, vocabulary 151,936: ~0.6 B
   parameters, ~1.2 GB in bf16) with random weights, built offline into the cache once
   (``model_dir``) with the tiny model's tokenizer: output tok/s, TPOT, and J per output
   token where NVML is readable;
4. **roofline**: the fraction of the GPU's HBM bandwidth that decode reached
   (``runners.roofline``: every weight plus the context's KV cache read once per step,
   1 / TPOT steps a second) for a GPU in servebench's table.

Without NVML it says so (``nvml: skipped``, with NVML's own reason) and runs what it can
on the CPU with a smaller workload, so the whole check fits in five minutes there too.
``--record FILE`` writes the raw NVML readings taken around the HF baseline (the format
``tests/runners`` replays: commit one from real hardware to replace the synthetic one).

Exit codes: 0 every check that could run passed; 1 a check failed (NVML unreadable
while PyTorch sees a CUDA GPU, the baseline failed...), or ``--require-gpu`` and no GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners import __version__, conditions, nvml, procs, roofline, tiny_model
from runners import telemetry as tm
from runners.environment import capture
from runners.hf import HFConfig

RECIPE_VERSION = 1
SEED = 4321
# Qwen3-0.6B's shape (its config.json), random weights.
QWEN3_0_6B = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
# (input, output, prompts, warm-ups): enough decode steps to time on a GPU; small on a CPU.
WORKLOAD = {"gpu": (512, 128, 8, 2), "cpu": (64, 16, 2, 1)}


@dataclass
class Check:
    name: str
    status: str  # ok | failed | skipped
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.name:<12} {self.status:<8} {self.summary}"


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def add(self, check: Check, echo: bool = True) -> Check:
        self.checks.append(check)
        if echo:
            print(check.line(), flush=True)
        return check

    def get(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def failed(self) -> bool:
        return any(c.status == "failed" for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "runner_version": __version__,
            "elapsed_s": round(time.monotonic() - self.started, 1),
            "ok": not self.failed,
            "checks": [c.__dict__ for c in self.checks],
        }


# --------------------------------------------------------------------------- the model


def default_dir() -> Path:
    return tiny_model.default_dir().parent / f"qwen3-0.6b-shaped-v{RECIPE_VERSION}"


def build_model(target: Path, shape: dict[str, Any], eos_id: int) -> Path:
    """Random bf16 weights of ``shape`` (a Qwen3 config's sizes) into ``target``, written
    to a temporary sibling and renamed into place (a crash leaves nothing half-written)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by checkouts
    try:
        config = Qwen3Config(**shape, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
        torch.manual_seed(SEED)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # built in bf16: half the memory and time
        try:
            model = Qwen3ForCausalLM(config).eval()
        finally:
            torch.set_default_dtype(previous)
        model.save_pretrained(tmp)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def ensure_model(target: Path | None = None) -> tuple[Path, Path]:
    """(model directory, tokenizer directory): the Qwen3-0.6B-shaped model, built once."""
    tokenizer = tiny_model.ensure()
    path = target or default_dir()
    if not (path / "config.json").exists():
        from transformers import AutoTokenizer

        eos = AutoTokenizer.from_pretrained(tokenizer).eos_token_id or 0
        try:
            build_model(path, QWEN3_0_6B, eos)
        except OSError:
            if not (path / "config.json").exists():  # not a concurrent build's win
                raise
    return path, tokenizer


def model_bytes(path: Path) -> int:
    """Bytes of weights decode reads per step: the safetensors files' tensors."""
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


# --------------------------------------------------------------------------- checks


def check_nvml(lib: Any = None) -> Check:
    """NVML: the GPUs, and one reading of every field (None: not supported)."""
    try:
        gpus = nvml.GPUs.open(lib, os.environ.get("CUDA_VISIBLE_DEVICES"))
    except nvml.NVMLUnavailable as exc:
        return Check("nvml", "skipped", f"{nvml.NOT_MEASURED}: {exc}", {"reason": str(exc)})
    try:
        reading = gpus.read()
        driver = None
        with contextlib.suppress(gpus.lib.NVMLError):
            version = gpus.lib.nvmlSystemGetDriverVersion()
            driver = version.decode() if isinstance(version, bytes) else str(version)
        devices = [d.__dict__ for d in gpus.devices]
    finally:
        gpus.close()
    missing = sorted({k for r in reading for k, v in r.items() if v is None})
    names = ", ".join(d["name"] for d in devices)
    # Energy needs the counter or, where a GPU has none (before Volta), power samples to
    # integrate (runners.nvml.summarize): only a GPU with neither fails.
    blind = [
        str(d["index"])
        for d, r in zip(devices, reading, strict=True)
        if r.get("energy_mj") is None and r.get("power_mw") is None
    ]
    status = "failed" if blind else "ok"
    summary = f"{len(devices)} GPU(s): {names}; driver {driver or 'unknown'}"
    if missing:
        summary += f"; not supported: {', '.join(missing)}"
    if blind:
        summary += (
            f" (GPU {', '.join(blind)}: no power or energy reading: J per token cannot be measured)"
        )
    elif "energy_mj" in missing:
        summary += " (no energy counter: energy is integrated from power samples)"
    details = {"devices": devices, "driver": driver, "reading": reading, "unsupported": missing}
    return Check("nvml", status, summary, details)


def check_environment() -> Check:
    env = capture(None)
    gpu = env.get("gpu") or {}
    software = env.get("software") or {}
    summary = (
        f"GPU {gpu.get('model')} x{gpu.get('count')}, driver {gpu.get('driver_version')}, "
        f"CUDA {software.get('cuda_runtime')}, torch {software.get('torch')}, "
        f"vLLM {software.get('vllm')}"
    )
    return Check("environment", "ok", summary, {"environment": env})


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def check_hf(
    model: Path,
    tokenizer: Path,
    workload: tuple[int, int, int, int],
    workdir: Path,
    cores: conditions.Cores,
    record: Path | None = None,
    lib: Any = None,
) -> Check:
    """The HF baseline as a run measures it, with NVML (``lib``: pynvml) sampled around
    it from here."""
    input_len, output_len, prompts, warmups = workload
    config = HFConfig(
        model=str(model),
        tokenizer=str(tokenizer),
        input_len=input_len,
        output_len=output_len,
        num_prompts=prompts,
        num_warmups=warmups,
    )
    result = workdir / "hf.json"
    argv = [sys.executable, "-m", "runners", "hf", *config.flags(), "--result", str(result)]
    if cores.source == "--cpus":
        argv += ["--cpus", cores.text]
    with nvml.Sampler(lib=lib) as gpu:
        code = procs.run(argv, workdir / "hf.log", env=procs.python_env())
    if record is not None and gpu.available:
        record.write_text(json.dumps(gpu.recording(), indent=1) + "\n", encoding="utf-8")
    data = json.loads(result.read_text()) if result.exists() else {}
    if code != 0 or "metrics" not in data:
        why = data.get("error") or f"exit code {code}: {procs.tail(workdir / 'hf.log')}"
        return Check("hf-baseline", "failed", why[:2000])
    metrics = data["metrics"]
    telemetry = tm.assemble(gpu, gpu.t0 or 0.0, data["detail"])
    derived = tm.derive(telemetry, metrics)
    summary = (
        f"{data['raw'].get('device')}: {metrics['output_throughput']:.1f} output tok/s, "
        f"mean TPOT {metrics['mean_tpot_ms']:.2f} ms ({prompts} x {input_len} in / "
        f"{output_len} out)"
    )
    if "energy_per_output_token_j" in derived:
        source = (telemetry.get("summary") or {}).get("energy_source")
        summary += (
            f", {derived['energy_per_output_token_j']:.3g} J per output token at "
            f"{derived.get('avg_power_w', 0):.0f} W"
            + (f" (energy from the {source})" if source else "")
        )
    else:
        summary += f"; energy {gpu.status if not gpu.available else 'not measured'}"
    details = {
        "metrics": metrics,
        "derived": derived,
        "raw": data["raw"],
        "summary": telemetry.get("summary"),
        "sampler": telemetry.get("sampler"),
        "conditions": data.get("conditions"),
        "command": config.command(),
    }
    return Check("hf-baseline", "ok", summary, details)


def check_roofline(hf: Check, model: Path, gpu_name: str | None) -> Check:
    """Decode at batch 1: bytes per step / TPOT against the GPU's HBM bandwidth."""
    if hf.status != "ok":
        return Check("roofline", "skipped", "no HF baseline measurement")
    if not gpu_name:
        return Check("roofline", "skipped", "n/a on CPU: the roofline is for GPUs")
    gpu = roofline.lookup_gpu(gpu_name)
    if gpu is None:
        return Check("roofline", "skipped", f"n/a: {gpu_name!r} is not in the bandwidth table")
    config = json.loads((model / "config.json").read_text())
    kv = roofline.kv_bytes_per_token(
        config["num_hidden_layers"], config["num_key_value_heads"], config["head_dim"], 2
    )
    raw, metrics = hf.details["raw"], hf.details["metrics"]
    point = {
        "x": 1,
        "concurrency": 1,
        "num_prompts": 1,
        "input_len": int(metrics["total_input_tokens"] / max(metrics["completed"], 1)),
        "output_len": int(metrics["total_output_tokens"] / max(metrics["completed"], 1)),
        "mean_tpot_ms": metrics["mean_tpot_ms"],
    }
    found = roofline.decode_roofline(gpu, 1, model_bytes(model), kv, [point])
    if not found:
        return Check("roofline", "skipped", "n/a: the baseline reported no TPOT")
    r = found[0]
    summary = (
        f"HF decode at batch 1 read {r.achieved_gbs:.0f} GB/s: {r.fraction:.1%} of "
        f"{gpu.name}'s {gpu.bandwidth_gbs:.0f} GB/s ({raw.get('device_name')})"
    )
    return Check("roofline", "ok", summary, {"fraction": r.fraction, "gbs": r.achieved_gbs})


# --------------------------------------------------------------------------- the command


def run(
    *,
    out: Path | None = None,
    record: Path | None = None,
    shape: str = "qwen3-0.6b",
    require_gpu: bool = False,
    cores: conditions.Cores | None = None,
    workdir: Path | None = None,
) -> int:
    """Run every check, print one line each, write ``out``; the exit code (module doc)."""
    report = Report()
    cores = cores or conditions.own_cores()
    nv = report.add(check_nvml())
    cuda = _cuda_available()
    if nv.status != "ok" and cuda:
        nv.status = "failed"
        nv.summary += " — but PyTorch sees a CUDA GPU: energy would not be measured"
    if require_gpu and not cuda:  # nothing else is worth the time on this node
        report.add(Check("gpu", "failed", "--require-gpu: PyTorch sees no CUDA GPU"))
        return _finish(report, out)
    report.add(check_environment())
    on_gpu = cuda and nv.status == "ok"
    workload = WORKLOAD["gpu" if cuda else "cpu"]
    if not cuda:
        print(f"{'':<12} {'':<8} no CUDA GPU: the baseline runs on the CPU, smaller", flush=True)
    t = time.monotonic()
    if shape == "tiny":
        model, tokenizer = tiny_model.ensure(), tiny_model.ensure()
    else:
        model, tokenizer = ensure_model()
    build_s = time.monotonic() - t
    workdir = workdir or Path(tempfile.mkdtemp(prefix="servebench-gpu-check-"))
    hf = report.add(check_hf(model, tokenizer, workload, workdir, cores, record))
    hf.details["model"] = {"shape": shape, "dir": str(model), "build_or_load_s": round(build_s, 1)}
    devices = nv.details.get("devices") or []
    report.add(check_roofline(hf, model, devices[0]["name"] if on_gpu and devices else None))
    return _finish(report, out)


def _finish(report: Report, out: Path | None) -> int:
    document = report.as_dict()
    verdict = "FAILED" if report.failed else "passed"
    print(f"gpu-check {verdict} in {document['elapsed_s']:.0f} s", flush=True)
    if out is not None:
        out.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    return 1 if report.failed else 0
