"""``python -m runners gpu-check`` on the hardware found (no NVML: it must say so and run
what it can on the CPU; an NVIDIA GPU: NVML read, the baseline on CUDA, energy measured),
and its NVML and roofline checks on a recorded session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from nvmlreplay import Replay, recording

from runners import gpucheck, roofline


def test_it_reports_the_hardware_it_finds_and_runs_the_baseline_there(
    hardware, tiny_model: Path, tmp_path: Path
) -> None:
    """Without NVML (this project's CPU machines) it says so and runs the baseline on the
    CPU; on an NVIDIA machine it reads the GPUs, runs on CUDA and measures energy."""
    out = tmp_path / "check.json"
    argv = [sys.executable, "-m", "runners", "gpu-check", "--shape", "tiny", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("gpu-check passed in ")
    report = json.loads(out.read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert [c["name"] for c in report["checks"]] == [
        "nvml",
        "environment",
        "hf-baseline",
        "roofline",
    ]
    assert checks["environment"]["status"] == "ok"
    environment = checks["environment"]["details"]["environment"]
    assert environment["gpu"]["count"] == len(hardware.gpus)
    hf = checks["hf-baseline"]
    assert hf["status"] == "ok"
    if not hardware.nvidia:
        assert lines[0].startswith("nvml         skipped  not measured (no NVML): ")
        assert any("no CUDA GPU: the baseline runs on the CPU" in line for line in lines)
        assert hf["details"]["raw"]["device"] == "cpu"
        assert hf["details"]["metrics"]["completed"] == gpucheck.WORKLOAD["cpu"][2]
        assert "energy not measured (no NVML)" in hf["summary"]
        assert hf["details"]["derived"] == {}
        assert checks["roofline"] == {
            "name": "roofline",
            "status": "skipped",
            "summary": "n/a on CPU: the roofline is for GPUs",
            "details": {},
        }
        return
    assert lines[0].startswith(f"nvml         ok       {len(hardware.gpus)} GPU(s): ")
    assert environment["gpu"]["model"] == " + ".join(sorted(set(hardware.gpus)))
    assert hf["details"]["raw"]["device"].startswith("cuda")
    assert hf["details"]["metrics"]["completed"] == gpucheck.WORKLOAD["gpu"][2]
    derived = hf["details"]["derived"]
    assert derived["energy_per_output_token_j"] > 0 and derived["avg_power_w"] > 0
    assert " J per output token at " in hf["summary"]
    if roofline.lookup_gpu(hardware.gpus[0]) is None:
        assert checks["roofline"]["status"] == "skipped"
        assert "not in the bandwidth table" in checks["roofline"]["summary"]
    else:
        assert checks["roofline"]["status"] == "ok"
        assert 0 < checks["roofline"]["details"]["fraction"] < 1


def test_require_gpu_fails_at_once_where_there_is_none(hardware) -> None:
    argv = [sys.executable, "-m", "runners", "gpu-check", "--shape", "tiny", "--require-gpu"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if hardware.cuda:
        assert done.returncode == 0, done.stdout + done.stderr[-2000:]
        assert "hf-baseline  ok" in done.stdout
        return
    assert done.returncode == 1, done.stderr[-2000:]
    assert "hf-baseline" not in done.stdout
    assert "gpu          failed   --require-gpu: PyTorch sees no CUDA GPU" in done.stdout


def test_record_keeps_the_raw_readings_around_the_baseline_in_the_replay_format(
    tiny_model: Path, tmp_path: Path
) -> None:
    """What a session with a GPU runs to replace the synthetic recording: here the GPUs
    are a replayed recording, so the file must read back through the same calls."""
    record = tmp_path / "nvml.json"
    workload = gpucheck.WORKLOAD["cpu"]
    cores = gpucheck.conditions.own_cores()
    check = gpucheck.check_hf(
        tiny_model, tiny_model, workload, tmp_path, cores, record, lib=Replay(recording())
    )
    assert check.status == "ok", check.summary
    assert check.details["summary"]["gpus"] == 2  # the replayed GPUs were sampled
    written = json.loads(record.read_text())
    assert [d["name"] for d in written["devices"]] == ["NVIDIA H200", "NVIDIA H200"]
    assert len(written["samples"]) >= 2
    assert written["samples"][0]["gpus"] == recording()["samples"][0]["gpus"]
    again = gpucheck.check_nvml(Replay(written))
    assert again.status == "ok" and again.details["reading"] == written["samples"][0]["gpus"]


def test_the_nvml_check_lists_the_gpus_and_what_they_do_not_answer():
    check = gpucheck.check_nvml(Replay(recording()))
    assert check.status == "ok"
    assert check.summary == "2 GPU(s): NVIDIA H200, NVIDIA H200; driver 570.124.06"
    data = recording()
    for sample in data["samples"]:
        sample["gpus"][0]["energy_mj"] = None
        sample["gpus"][1]["clock_reasons"] = None
    # No energy counter (a pre-Volta board): power is integrated instead, as documented.
    check = gpucheck.check_nvml(Replay(data))
    assert check.status == "ok" and check.details["unsupported"] == [
        "clock_reasons",
        "energy_mj",
    ]
    assert check.summary.endswith("(no energy counter: energy is integrated from power samples)")
    for sample in data["samples"]:
        sample["gpus"][0]["power_mw"] = None
    check = gpucheck.check_nvml(Replay(data))
    assert check.status == "failed"
    assert "GPU 0: no power or energy reading: J per token cannot be measured" in check.summary


def test_without_an_energy_counter_the_baseline_integrates_power(
    tiny_model: Path, tmp_path: Path
) -> None:
    data = recording()
    for sample in data["samples"]:
        for gpu in sample["gpus"]:
            gpu["energy_mj"] = None
    cores = gpucheck.conditions.own_cores()
    check = gpucheck.check_hf(
        tiny_model, tiny_model, gpucheck.WORKLOAD["cpu"], tmp_path, cores, lib=Replay(data)
    )
    assert check.status == "ok", check.summary
    assert check.details["summary"]["energy_source"] == "power integral"
    assert check.details["derived"]["energy_per_output_token_j"] > 0
    assert "J per output token at" in check.summary
    assert check.summary.endswith("(energy from the power integral)")


def test_the_roofline_is_bytes_per_decode_step_over_tpot_against_hbm(tiny_model: Path):
    config = json.loads((tiny_model / "config.json").read_text())
    metrics = {
        "completed": 4,
        "total_input_tokens": 4 * 64.0,
        "total_output_tokens": 4 * 16.0,
        "mean_tpot_ms": 2.0,
    }
    hf = gpucheck.Check("hf-baseline", "ok", "", {"metrics": metrics, "raw": {}})
    check = gpucheck.check_roofline(hf, tiny_model, "NVIDIA H200")
    kv = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * config["head_dim"] * 2
    step = gpucheck.model_bytes(tiny_model) + (64 + 16 / 2) * kv
    expected = step / 0.002 / (roofline.lookup_gpu("H200").bandwidth_gbs * 1e9)
    assert check.status == "ok" and check.details["fraction"] == pytest.approx(expected)
    assert "of NVIDIA H200's 4800 GB/s" in check.summary
    unknown = gpucheck.check_roofline(hf, tiny_model, "Some Accelerator 9000")
    assert unknown.status == "skipped" and "not in the bandwidth table" in unknown.summary


def test_the_default_model_is_shaped_like_qwen3_0_6b():
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.device("meta"):  # sizes only: no memory, no weights
        model = Qwen3ForCausalLM(Qwen3Config(**gpucheck.QWEN3_0_6B))
    params = sum(p.numel() for p in model.parameters())
    embedding = 151936 * 1024
    assert 0.59e9 < params < 0.61e9  # "0.6B" (0.44B without the tied embedding)
    assert 0.43e9 < params - embedding < 0.45e9


def test_a_model_is_built_offline_with_random_weights_in_bf16(tiny_model: Path, tmp_path):
    shape = {**gpucheck.QWEN3_0_6B, "vocab_size": 512, "num_hidden_layers": 2}
    shape |= {"hidden_size": 128, "intermediate_size": 256, "head_dim": 64}
    shape |= {"num_attention_heads": 2, "num_key_value_heads": 1}
    target = gpucheck.build_model(tmp_path / "shaped", shape, eos_id=0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target)
    params = sum(p.numel() for p in model.parameters())
    assert next(model.parameters()).dtype.is_floating_point
    assert json.loads((target / "config.json").read_text())["num_hidden_layers"] == 2
    # bf16 on disk: two bytes a parameter (plus the safetensors header).
    assert 2 * params <= gpucheck.model_bytes(target) < 2 * params + 64 * 1024
    assert not list(tmp_path.glob(".shaped-*"))  # no half-written sibling left
