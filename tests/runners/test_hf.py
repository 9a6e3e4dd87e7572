"""The HF sequential baseline on the tiny model: real transformers generate() on CPU."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runners.hf import HFConfig, HFResult, run
from runners.result import METRIC_KEYS

PROMPTS, INPUT_LEN, OUTPUT_LEN = 3, 48, 12
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def result(tiny_model) -> HFResult:
    config = HFConfig(
        model=str(tiny_model),
        input_len=INPUT_LEN,
        output_len=OUTPUT_LEN,
        num_prompts=PROMPTS,
        num_warmups=1,
        seed=3,
    )
    return run(config)


def test_it_reports_vllms_metric_keys(result):
    assert set(result.metrics) == set(METRIC_KEYS) - {"request_goodput"}
    assert all(v >= 0 for v in result.metrics.values())


def test_every_request_produces_exactly_the_requested_tokens(result):
    m = result.metrics
    assert result.detail["output_lens"] == [OUTPUT_LEN] * PROMPTS
    assert m["total_output_tokens"] == PROMPTS * OUTPUT_LEN
    assert m["total_input_tokens"] == PROMPTS * INPUT_LEN
    assert m["completed"] == PROMPTS and m["failed"] == 0
    assert [len(gaps) for gaps in result.detail["itls"]] == [OUTPUT_LEN - 1] * PROMPTS


def test_throughputs_are_tokens_over_the_timed_loop(result):
    m = result.metrics
    assert m["duration"] > 0
    assert math.isclose(m["output_throughput"], m["total_output_tokens"] / m["duration"])
    assert math.isclose(m["request_throughput"], PROMPTS / m["duration"])
    total = m["total_input_tokens"] + m["total_output_tokens"]
    assert math.isclose(m["total_token_throughput"], total / m["duration"])
    # Requests run one after another inside the timed loop.
    assert sum(result.detail["latencies"]) <= m["duration"]


def test_per_request_timings_are_consistent(result):
    d = result.detail
    for ttft, gaps, latency in zip(d["ttfts"], d["itls"], d["latencies"], strict=True):
        assert 0 < ttft < latency
        assert all(g > 0 for g in gaps)
        assert ttft + sum(gaps) <= latency
    m = result.metrics
    assert 0 < m["p50_ttft_ms"] <= m["p99_ttft_ms"] < m["p99_e2el_ms"]
    assert m["mean_tpot_ms"] > 0 and m["mean_itl_ms"] > 0


def test_it_records_how_to_reproduce_it(result, tiny_model):
    assert result.command == (
        f"python -m runners hf --model {tiny_model} --dtype bfloat16 --input-len 48 "
        "--output-len 12 --num-prompts 3 --num-warmups 1 --seed 3"
    )
    assert result.raw["device"] == "cpu" and result.raw["dtype"] == "bfloat16"
    assert result.gpu_memory_peak_bytes is None  # only measured on CUDA


def test_prompts_are_reproducible_from_the_seed():
    from runners.hf import random_prompts

    a = random_prompts(16, vocab_size=100, special_ids={0}, n=2, seed=5)
    b = random_prompts(16, vocab_size=100, special_ids={0}, n=2, seed=5)
    assert a.shape == (2, 16) and a.equal(b)
    assert 0 not in a.tolist()[0] + a.tolist()[1]


def test_it_records_the_conditions_of_the_timed_loop(result):
    c = result.conditions
    assert c["threads"] == result.raw["torch_threads"]
    assert (
        c["cores"]
        and c["core_count"] >= 1
        and c["cores_source"]
        in (
            "affinity",
            "SERVEBENCH_CPUS",
        )
    )
    assert c["wall_s"] >= result.metrics["duration"] - 0.001  # it brackets the timed loop
    assert c["process_cpu_s"] > 0
    for key in ("others_cpu_s", "others_share", "steal_share", "load_avg", "top_others"):
        assert key in c
    assert isinstance(c["contended"], bool) and isinstance(c["reasons"], list)
    assert c["contended"] == bool(c["reasons"])
    assert "one pass" in result.raw["timing"]


def test_through_the_runner_a_rival_on_its_core_flags_the_baseline(tiny_model, tmp_path):
    """`python -m runners run --cpus N` with another process burning core N: the HF
    point still has every metric, one thread on that core, and is marked contended by
    the other process's CPU time. The loop is long enough (384 tokens: ~1 s here) for
    that time to stand above the clock ticks /proc/stat counts in, on a fast machine too
    (3 prompts of 12 tokens once took too short a loop for it, and only "kept waiting"
    said why)."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    spec = {
        "name": "contended hf",
        "model": {"id": str(tiny_model), "max_model_len": 512},
        "workload": {"input_len": INPUT_LEN, "output_len": 48, "num_prompts": 8},
        "backends": [{"kind": "hf-sequential", "num_prompts": 8}],
        "resources": {"gpu_count": 0},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    rival = subprocess.Popen(
        [sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"]
    )
    try:
        argv = [sys.executable, "-m", "runners", "run", str(tmp_path / "spec.json"), "--quiet"]
        argv += ["--cpus", str(cpu), "--out", str(tmp_path / "result.json")]
        argv += ["--workdir", str(tmp_path / "work")]
        subprocess.run(argv, cwd=REPO, check=True, timeout=600)
    finally:
        rival.kill()
        rival.wait()
    (m,) = json.loads((tmp_path / "result.json").read_text())["measurements"]
    assert m["status"] == "succeeded"
    assert set(m["metrics"]) == set(METRIC_KEYS) - {"request_goodput"}
    c = m["conditions"]
    assert (c["cores"], c["cores_source"], c["threads"]) == (str(cpu), "--cpus", 1)
    assert m["raw"]["torch_threads"] == 1
    assert c["contended"] is True
    assert any(r.startswith("other processes used") for r in c["reasons"]), c
