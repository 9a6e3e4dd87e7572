"""The HF sequential baseline on the tiny model: real transformers generate() on CPU."""

from __future__ import annotations

import math

import pytest

from runners.hf import HFConfig, HFResult, run
from runners.result import METRIC_KEYS

PROMPTS, INPUT_LEN, OUTPUT_LEN = 3, 48, 12


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
