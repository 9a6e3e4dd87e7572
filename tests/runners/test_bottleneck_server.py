"""What limited a point, on a real vLLM server (issue 26, item 4): ``max_num_seqs: 1`` under
concurrency 8 names the scheduler queue, with the peaks the server reported, and the bench
client's own CPU time over the requests' window is recorded with the point; a KV cache of
eight blocks under concurrency 8 names KV capacity with the preemptions the server counted.
(A client held to a fraction of a core: ``test_vllm.py``.)

Two server starts, one point each. They run eager (``enforce_eager``): what limits the
point is the scheduler and the cache, not the compiled model, and torch.compile's warm-up
would add ~18 s to each start on 2 cores. The other causes are provoked on the recorded
point in ``test_bottleneck.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runners import bottleneck
from runners.result import Measurement
from runners.spec import Point, parse_spec
from runners.vllm_bench import measure_point
from runners.vllm_server import VLLMServer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("have_vllm")]


def measured_alone(
    model: Path,
    tmp_path: Path,
    *,
    max_model_len: int,
    output_len: int,
    num_prompts: int,
    num_warmups: int,
    **backend: Any,
) -> Measurement:
    """One point at concurrency 8 (64 prompt tokens) on a vLLM server of its own with
    ``backend``'s fields."""
    spec = parse_spec(
        {
            "model": {"id": str(model), "max_model_len": max_model_len},
            "workload": {
                "input_len": 64,
                "output_len": output_len,
                "num_prompts": num_prompts,
                "num_warmups": num_warmups,
            },
            "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [8]}],
            "backends": [{"kind": "vllm", "enforce_eager": True, **backend}],
        }
    )
    point = Point(
        sweep="concurrency",
        axis="max_concurrency",
        value=8,
        input_len=64,
        output_len=output_len,
        max_concurrency=8,
        num_prompts=num_prompts,
        request_rate=None,
    )
    with VLLMServer(spec, spec.vllm_backends[0], tmp_path / "server.log") as server:
        m = measure_point(server, spec, spec.vllm_backends[0], point, 0, tmp_path)
    assert m.status == "succeeded", m.error
    return m


def test_max_num_seqs_1_under_concurrency_8_names_the_scheduler_queue(tiny_model, tmp_path):
    m = measured_alone(
        tiny_model,
        tmp_path,
        max_model_len=512,
        output_len=32,
        num_prompts=24,
        num_warmups=1,
        max_num_seqs=1,
    )
    server_metrics = m.server_metrics
    assert server_metrics is not None
    assert server_metrics.num_requests_running_peak == 1
    assert (server_metrics.num_requests_waiting_peak or 0) >= 2
    found = bottleneck.diagnose(m.model_dump(mode="json"))
    assert found.cause == "scheduler-queue", found
    assert found.sentence.startswith("The scheduler ran at most 1 request at once while up to ")
    # The load generator's own CPU over the requests' window: measured, and at most a core
    # and a bit (one asyncio thread, plus the tokenizer's).
    cpu = m.conditions["client_cpu_per_wall"]
    assert 0 < cpu < 1.5, m.conditions
    assert m.conditions["client_cpu_s"] > 0


def test_a_tiny_kv_cache_under_concurrency_8_names_kv_capacity_with_its_preemptions(
    tiny_model, tmp_path
):
    # Eight usable 32-token blocks (one more is vLLM's null block): 256 tokens, one
    # max_model_len sequence. Eight requests of 64 prompt tokens fill them at once, and
    # each needs a third block when its decode passes token 64: the scheduler preempts.
    m = measured_alone(
        tiny_model,
        tmp_path,
        max_model_len=256,
        output_len=64,
        num_prompts=16,
        num_warmups=0,
        block_size=32,
        enable_prefix_caching=False,
        extra_args=["--num-gpu-blocks-override", "9"],
    )
    server_metrics = m.server_metrics
    assert server_metrics is not None
    assert server_metrics.num_gpu_blocks == 9 and server_metrics.block_size == 32
    assert (server_metrics.preemptions or 0) >= 1, server_metrics
    found = bottleneck.diagnose(m.model_dump(mode="json"))
    assert found.cause == "kv-capacity", found
    assert found.sentence.startswith("The KV cache ran out: "), found.sentence
    assert "preemption" in found.sentence
