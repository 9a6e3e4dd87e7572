"""Ready-made specs: the seed tutorial's experiment (``seed``), the same against every HF
baseline (``seed-all-baselines``), and the CPU demo on the tiny model (``tiny_demo``)."""

from __future__ import annotations

from typing import Any

from runners.choices import choice_message
from runners.spec.backends import (
    HFBackend,
    HFBatchedBackend,
    HFStaticCacheBackend,
    TransformersServeBackend,
    VLLMBackend,
)
from runners.spec.model import ModelSpec
from runners.spec.resources import Resources
from runners.spec.root import Spec
from runners.spec.workload import Sweep, Workload


def seed_experiment() -> Spec:
    """The seed tutorial's experiment, exactly: Qwen3-0.6B, bf16, 4096 context; three sweeps."""
    return Spec(
        name="Seed experiment: Qwen3-0.6B, HF sequential vs vLLM",
        model=ModelSpec(id="Qwen/Qwen3-0.6B", dtype="bfloat16", max_model_len=4096),
        workload=Workload(
            input_len=1024,
            output_len=128,
            num_prompts=256,
            ignore_eos=True,
            num_warmups=8,
            max_concurrency=64,
        ),
        sweeps=[
            Sweep(name="concurrency", axis="max_concurrency", values=[1, 4, 16, 64]),
            Sweep(name="prompt-length", axis="input_len", values=[128, 1024, 2048]),
            Sweep(name="output-length", axis="output_len", values=[32, 128, 512, 1024]),
        ],
        backends=[HFBackend(input_len=1024, output_len=128), VLLMBackend()],
    )


def seed_all_baselines() -> Spec:
    """The seed experiment against every Hugging Face baseline: the sequential loop, the
    static-cache compiled loop, static batches of each point's concurrency, and
    Transformers' own server with continuous batching."""
    seed = seed_experiment()
    return Spec(
        name="Seed experiment: Qwen3-0.6B, every HF baseline vs vLLM",
        model=seed.model,
        workload=seed.workload,
        sweeps=seed.sweeps,
        backends=[
            HFBackend(input_len=1024, output_len=128),
            HFStaticCacheBackend(input_len=1024, output_len=128),
            HFBatchedBackend(),
            TransformersServeBackend(name="transformers-serve-cb"),
            VLLMBackend(),
        ],
    )


def tiny_demo(model_dir: str) -> Spec:
    """A CPU-sized run on the tiny test model: the demo and the end-to-end tests use it."""
    return Spec(
        name="Tiny model demo (CPU)",
        model=ModelSpec(id=model_dir, dtype="bfloat16", max_model_len=2048),
        workload=Workload(input_len=128, output_len=32, num_prompts=32, num_warmups=2),
        sweeps=[Sweep(name="concurrency", axis="max_concurrency", values=[1, 4, 16])],
        backends=[HFBackend(num_prompts=8), VLLMBackend()],
        resources=Resources(gpu_count=0, timeout_minutes=30),
    )


PRESETS: dict[str, dict[str, Any]] = {
    "seed": {
        "title": "Seed experiment (Qwen3-0.6B)",
        "description": (
            "HF sequential baseline vs vLLM: concurrency 1/4/16/64 at 1024 in / 128 out, "
            "prompt length 128/1024/2048 at concurrency 64, output length 32/128/512/1024; "
            "256 prompts, ignore-eos, 8 warm-ups."
        ),
        "build": seed_experiment,
    },
    "seed-all-baselines": {
        "title": "Seed experiment, every HF baseline (Qwen3-0.6B)",
        "description": (
            "The seed experiment against hf-sequential, hf-static-cache (static KV cache, "
            "torch.compile), hf-batched (static batches of each point's concurrency) and "
            "transformers serve with continuous batching, at vLLM's points."
        ),
        "build": seed_all_baselines,
    },
}

# A preset that needs a model directory (the tiny model, built offline): offered by a portal
# that knows where that directory is (SERVEBENCH_TINY_MODEL_DIR), built with ``tiny_demo``.
TINY_DEMO = "tiny-demo"
TINY_DEMO_PRESET: dict[str, str] = {
    "title": "Tiny demo model (CPU, a few minutes)",
    "description": (
        "The tiny random Qwen3-shaped model built offline: HF sequential baseline (8 "
        "prompts) and vLLM at concurrency 1/4/16, 128 in / 32 out, 32 prompts; no GPU."
    ),
}


def preset(name: str) -> Spec:
    """A preset by name; KeyError names the ones that exist."""
    try:
        return PRESETS[name]["build"]()
    except KeyError:
        raise KeyError(choice_message(name, sorted(PRESETS), "preset")) from None
