"""A run whose points each show one cause of what limited them (issue 26, item 4).

The real tiny-model vLLM point measured on this project's CPU machines
(``data/tiny-vllm-c8-point.json``) stored through the real ingestion service at five
concurrencies: as recorded (other processes took its cores), with the peaks a tiny KV cache
leaves (preemptions), with those of ``max_num_seqs: 1`` (one running, the rest waiting),
with a saturated client's CPU time, and one that failed on the network.
"""

from __future__ import annotations

import copy
from typing import Any

from energydata import cpu_point, ingest


def _at(body: dict[str, Any], concurrency: int) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body["point"] |= {
        "key": f"concurrency:max_concurrency={concurrency}",
        "value": float(concurrency),
        "max_concurrency": concurrency,
    }
    return body


def limited_run(make_run: Any, spec_dict: Any) -> Any:
    spec = spec_dict(
        workload={"input_len": 128, "output_len": 32, "num_prompts": 48, "num_warmups": 1},
        sweeps=[{"name": "concurrency", "axis": "max_concurrency", "values": [2, 4, 8, 16, 32]}],
    )
    run = make_run(spec=spec, status="running", is_public=True)
    base = cpu_point()
    quiet = copy.deepcopy(base)
    quiet["conditions"] |= {"contended": False, "reasons": [], "others_cpu_s": 0.0}

    client = _at(quiet, 2)
    client["conditions"] |= {"client_cpu_s": 1.3, "client_cpu_per_wall": 0.96}
    ingest(run, client)
    kv = _at(quiet, 4)
    kv["server_metrics"] |= {
        "preemptions": 37.0, "kv_cache_usage_peak": 1.0, "num_requests_running_peak": 3.0,
        "num_requests_waiting_peak": 1.0,
    }  # fmt: skip
    ingest(run, kv)
    ingest(run, _at(base, 8))
    queue = _at(base, 16)
    queue["server_metrics"] |= {"num_requests_running_peak": 1.0, "num_requests_waiting_peak": 15.0}
    ingest(run, queue)
    failed = _at(base, 32) | {"status": "failed", "metrics": {}}
    failed["error"] = (
        "aiohttp.ClientConnectorError: Cannot connect to host 127.0.0.1:8000 "
        "[Connection refused]\nTraceback (most recent call last): ..."
    )
    ingest(run, failed)
    return run


EXPECTED = {
    "concurrency:max_concurrency=2": "client",
    "concurrency:max_concurrency=4": "kv-capacity",
    "concurrency:max_concurrency=8": "cpu/scheduler",
    "concurrency:max_concurrency=16": "scheduler-queue",
    "concurrency:max_concurrency=32": "network",
}
