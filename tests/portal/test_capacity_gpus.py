"""A vLLM server's GPUs in the capacity panel are the spec's (``gpus_per_server``: tensor
x pipeline x data parallel): its memory and HBM bandwidth are theirs, and each
data-parallel replica holds the weights once. Llama-3.1-8B in bf16 (~16.06 GB of
weights) on H100 SXM (81,559 MiB, 3.35 TB/s), as in ``test_capacity``; no database."""

from __future__ import annotations

import pytest
from test_capacity import curve, env, spec

from portal.benchmarks import capacity as cap

H100_MIB = 81559
H100_BYTES_PER_S = 3350e9
KV_PER_TOKEN = 131_072  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes


@pytest.mark.parametrize(
    ("vllm", "gpus", "replicas"),
    [
        ({}, 1, 1),
        ({"tensor_parallel_size": 2}, 2, 1),
        ({"tensor_parallel_size": 2, "extra_args": ["--pipeline-parallel-size", "2"]}, 4, 1),
        ({"extra_args": ["--data-parallel-size=2"]}, 2, 2),
    ],
)
def test_the_server_spans_the_specs_gpus(vllm: dict, gpus: int, replicas: int) -> None:
    plan = cap.plan(spec(**vllm), env(count=gpus), curve(tpot_ms=10.0))
    weights = plan.weights_bytes
    assert weights == pytest.approx(16.06e9, rel=0.01)
    assert plan.cache.bytes == pytest.approx(
        gpus * H100_MIB * 2**20 * 0.9 - replicas * weights, rel=1e-6
    )
    first = plan.roofline[0]
    # One sequence: every replica's weights and its KV (1024 + 64 tokens) every 10 ms.
    step = replicas * weights + (1024 + 64) * KV_PER_TOKEN
    assert first.bytes_per_step == pytest.approx(step)
    assert first.fraction == pytest.approx(step / 0.010 / (gpus * H100_BYTES_PER_S))


def test_the_estimate_says_how_many_gpus_and_replicas_it_counted() -> None:
    both = spec(tensor_parallel_size=2, extra_args=["--data-parallel-size", "2"])
    plan = cap.plan(both, env(count=4), curve())
    assert plan.cache.source.startswith("estimate: 4 x 80 GiB x gpu_memory_utilization 0.9 - ")
    assert "GiB weights x 2 data-parallel replicas" in plan.cache.source
