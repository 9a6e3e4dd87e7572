"""``make gpu-check`` (``scripts/gpu_check.py``): where there is no usable GPU it says so,
says what to do and exits 2; its spec is one the runner accepts; its table's arithmetic
(J per token, the roofline estimate from the measured batch, the anchors) on a result
document whose numbers are chosen to check by hand."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nvmlreplay import Replay, recording

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
assert _spec is not None and _spec.loader is not None
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check  # its dataclasses look their module up
_spec.loader.exec_module(gpu_check)

KV = 2 * 28 * 8 * 128 * 2  # Qwen3-0.6B: layers x KV heads x head dim, K and V, bf16
WEIGHTS = 1_200_000_000
H100_BYTES_PER_S = 3350e9


def test_without_a_visible_gpu_it_says_what_to_do_and_exits_2() -> None:
    """CUDA_VISIBLE_DEVICES="" hides every GPU on any machine: this path runs everywhere."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    first, *rest = done.stderr.splitlines()
    assert first.startswith("gpu-check: no usable NVIDIA GPU on this machine (NVML cannot read")
    text = "\n".join(rest)
    assert "`nvidia-smi` lists the GPU" in text and "CUDA_VISIBLE_DEVICES" in text
    assert "torch.cuda.is_available()" in text and "docs/gpu.md" in text


def test_it_needs_both_nvml_and_cuda(hardware) -> None:
    names, why = gpu_check.find_gpu(Replay(recording()))
    assert names == ["NVIDIA H200", "NVIDIA H200"]
    if hardware.cuda:
        assert why == ""
    else:
        assert why.startswith("NVML reads NVIDIA H200, NVIDIA H200, but PyTorch ")
        assert why.endswith("sees no CUDA device")


def test_its_run_is_a_spec_the_runner_accepts(tmp_path: Path) -> None:
    spec = gpu_check.build_spec(tmp_path / "model", tmp_path / "tokenizer", with_vllm=True)
    assert [b["kind"] for b in spec["backends"]] == ["hf-sequential", "hf-batched", "vllm"]
    assert spec["sweeps"][0]["values"] == [1, 4]  # the anchors' concurrencies
    plain = gpu_check.build_spec(tmp_path / "model", tmp_path / "tokenizer", with_vllm=False)
    assert "vllm" not in [b["kind"] for b in plain["backends"]]


def measurement(backend: str, concurrency: int, metrics: dict, **extra) -> dict:
    return {
        "backend": backend,
        "status": "succeeded",
        "point": {
            "max_concurrency": concurrency,
            "num_prompts": 32,
            "input_len": 512,
            "output_len": 128,
        },
        "metrics": metrics,
        **extra,
    }


def document() -> dict:
    vllm = measurement(
        "vllm",
        4,
        {
            "output_throughput": 900.0,
            "mean_tpot_ms": 4.0,
            "avg_power_w": 349.0,
            "energy_per_output_token_j": 0.35,
        },
        server_metrics={"num_requests_running_mean": 3.6},
    )
    hf = measurement(
        "hf-sequential",
        1,
        {"output_throughput": 150.0, "mean_tpot_ms": 6.5, "total_output_tokens": 400},
        telemetry={"summary": {"energy_j": 100.0, "avg_power_w": 180.0}},
    )
    failed = {**measurement("hf-batched", 4, {}), "status": "failed"}
    config = {"num_hidden_layers": 28, "num_key_value_heads": 8, "head_dim": 128}
    return {
        "environment": {
            "gpu": {"model": "NVIDIA H100 80GB HBM3", "count": 1, "memory_total_mib": 81559},
            "model": {"config": config},
        },
        "measurements": [vllm, hf, failed],
    }


def test_the_table_derives_energy_and_the_roofline_by_the_runners_rules() -> None:
    hf, vllm = gpu_check.rows(document(), WEIGHTS)
    assert (hf.backend, vllm.backend) == ("hf-sequential", "vllm")  # the failed one is left out
    assert hf.j_per_token == pytest.approx(100.0 / 400)  # telemetry's energy over its tokens
    assert vllm.j_per_token == 0.35 and vllm.avg_power_w == 349.0
    # vLLM measured 3.6 requests running on average: that is the batch each step read.
    step = WEIGHTS + 3.6 * (512 + 128 / 2) * KV
    assert (vllm.batch, vllm.batch_source) == (3.6, "measured")
    assert vllm.roofline_fraction == pytest.approx(step / 0.004 / H100_BYTES_PER_S)
    # The HF loop reports no running batch: one sequence, assumed.
    step = WEIGHTS + 1 * (512 + 64) * KV
    assert (hf.batch, hf.batch_source) == (1.0, "assumed")
    assert hf.roofline_fraction == pytest.approx(step / 0.0065 / H100_BYTES_PER_S)
    text = gpu_check.table([hf, vllm])
    assert "3.6 measured" in text and "* decode roofline, an estimate" in text
    assert text.splitlines()[0].split() == [
        "backend", "conc", "out", "tok/s", "TPOT", "ms", "power", "W", "J/token", "roofline*",
        "batch",
    ]  # fmt: skip


def test_the_anchors_sit_beside_our_numbers_at_the_same_point() -> None:
    found = gpu_check.rows(document(), WEIGHTS)
    h100, a100 = gpu_check.anchor_lines(found, "NVIDIA H100 80GB HBM3")
    assert h100 == (
        "1x H100, vLLM, DCGM power at concurrency 4: 349 W; 349 W here, 1.00x the anchor "
        "(same GPU family)"
    )
    assert a100 == (
        "1x A100, vLLM, mean TPOT at concurrency 1: 4.2 ms; not measured here (vllm at "
        "concurrency 1 did not run) (this GPU is NVIDIA H100 80GB HBM3, not A100)"
    )
    other, _ = gpu_check.anchor_lines(found, "NVIDIA L4")
    assert other.endswith("349 W here (this GPU is NVIDIA L4, not H100)")  # context, no ratio
