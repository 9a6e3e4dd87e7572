"""What limited a point, on a real vLLM server (issue 26, item 4): ``max_num_seqs: 1`` under
concurrency 8 names the scheduler queue, with the peaks the server reported, and the bench
client's own CPU time over the requests' window is recorded with the point.

One server start (~100 s on 2 CPU cores), one point. The other causes are provoked on the
recorded point in ``test_bottleneck.py``.
"""

from __future__ import annotations

import pytest

from runners import bottleneck
from runners.spec import Point, parse_spec
from runners.vllm_bench import measure_point
from runners.vllm_server import VLLMServer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("have_vllm")]


def test_max_num_seqs_1_under_concurrency_8_names_the_scheduler_queue(tiny_model, tmp_path):
    spec = parse_spec(
        {
            "model": {"id": str(tiny_model), "max_model_len": 512},
            "workload": {"input_len": 64, "output_len": 32, "num_prompts": 24, "num_warmups": 1},
            "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [8]}],
            "backends": [{"kind": "vllm", "max_num_seqs": 1}],
        }
    )
    backend = spec.vllm_backends[0]
    point = Point(
        sweep="concurrency",
        axis="max_concurrency",
        value=8,
        input_len=64,
        output_len=32,
        max_concurrency=8,
        num_prompts=24,
        request_rate=None,
    )
    with VLLMServer(spec, backend, tmp_path / "server.log") as server:
        m = measure_point(server, spec, backend, point, 0, tmp_path)
    assert m.status == "succeeded", m.error
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
