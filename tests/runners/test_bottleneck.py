"""What limited each point (issue 26, item 4): ``runners.bottleneck`` on real measurements.

Data: a real tiny-model vLLM point measured on this project's 2-core CPU machines
(``tests/portal/data/tiny-vllm-c8-point.json``: its /metrics peaks, its conditions, which
say other processes took 79% of its cores), taken as recorded and with the evidence each
cause leaves changed to what a server or client in that state reports (a tiny KV cache
preempts, ``max_num_seqs: 1`` keeps requests waiting, a saturated client uses its whole
core). The real server with ``max_num_seqs: 1`` is in ``test_bottleneck_server.py``.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest

from runners import bottleneck as bn
from runners import conditions
from runners.bench_client import CpuSampler
from runners.result import Measurement
from runners.vllm_bench import client_cpu

POINT = Path(__file__).parents[1] / "portal" / "data" / "tiny-vllm-c8-point.json"


def recorded() -> dict[str, Any]:
    return json.loads(POINT.read_text())


def quiet() -> dict[str, Any]:
    """The recorded point as if nothing else had run on its cores."""
    m = recorded()
    m["conditions"] |= {"contended": False, "reasons": [], "others_cpu_s": 0.0}
    return m


def test_every_cause_is_named_in_the_catalogue() -> None:
    assert set(bn.CAUSES) == {
        "kv-capacity", "scheduler-queue", "compute-prefill",
        "memory-bandwidth-decode (estimate)", "cpu/scheduler", "client", "errors", "network",
        "unknown",
    }  # fmt: skip


def test_the_recorded_point_names_the_processes_that_took_its_cores() -> None:
    m = recorded()
    Measurement.model_validate(m)  # the real document shape
    found = bn.diagnose(m)
    assert found.cause == "cpu/scheduler"
    assert "other processes used 1.58 CPUs of the 2 cores" in found.sentence


def test_a_cpu_run_with_nothing_else_limiting_it_is_unknown_and_says_why() -> None:
    found = bn.diagnose(quiet())
    assert found.cause == "unknown"
    assert "no GPU utilisation was measured" in found.sentence
    assert "it ran up to 8 of 8 requests, none waited" in found.sentence
    assert "no preemptions" in found.sentence


def test_a_tiny_kv_cache_names_kv_capacity_with_its_preemptions() -> None:
    m = quiet()
    m["server_metrics"] |= {
        "preemptions": 37.0,
        "kv_cache_usage_peak": 1.0,
        "num_requests_running_peak": 3.0,
        "num_requests_waiting_peak": 5.0,
    }
    found = bn.diagnose(m)
    assert found.cause == "kv-capacity"
    assert found.sentence == (
        "The KV cache ran out: 37 preemptions, usage peaked at 100%, up to 5 requests waited."
    )


def test_a_full_kv_cache_with_a_queue_and_no_preemptions_is_kv_capacity() -> None:
    m = quiet()
    m["server_metrics"] |= {"kv_cache_usage_peak": 0.97, "num_requests_waiting_peak": 4.0}
    assert bn.diagnose(m).cause == "kv-capacity"
    m["server_metrics"]["num_requests_waiting_peak"] = 0.0  # full, but nobody waited
    assert bn.diagnose(m).cause == "unknown"


def test_max_num_seqs_1_under_concurrency_8_names_the_scheduler_queue() -> None:
    m = recorded()  # contended too: a hard cap shows whatever else ran
    m["server_metrics"] |= {"num_requests_running_peak": 1.0, "num_requests_waiting_peak": 7.0}
    found = bn.diagnose(m)
    assert found.cause == "scheduler-queue"
    assert "ran at most 1 request at once while up to 7 waited, of the 8" in found.sentence
    assert "KV cache at most 0.1% full" in found.sentence


def test_one_request_waiting_for_a_step_is_not_a_queue() -> None:
    m = quiet()
    m["server_metrics"] |= {"num_requests_running_peak": 7.0, "num_requests_waiting_peak": 1.0}
    assert bn.diagnose(m).cause == "unknown"


def test_a_client_using_its_whole_core_names_the_client() -> None:
    m = recorded()
    m["conditions"] |= {"client_cpu_s": 1.35, "client_cpu_per_wall": 0.97}
    found = bn.diagnose(m)
    assert found.cause == "client"
    assert "0.97 CPU-seconds per second" in found.sentence


def test_one_of_three_clients_held_off_its_core_is_named_with_more_clients_suggested() -> None:
    m = recorded()
    ok = {"cpu_per_wall": 0.2, "wait_per_wall": 0.1, "send_lag_p99_ms": 12.0}
    held = {"cpu_per_wall": 0.05, "wait_per_wall": 0.88, "send_lag_p99_ms": 900.0}
    m["conditions"]["clients"] = [{"index": i} | ok for i in (0, 2)]
    m["conditions"]["clients"].insert(1, {"index": 1} | held)
    m["conditions"]["client_placement"] = "each client on its own core of 4"
    found = bn.diagnose(m)
    assert found.cause == "client"
    assert found.sentence.startswith("Client 1 of 3 was the limit: it used 0.05 CPU-seconds")
    assert "waited 0.88 more for a core" in found.sentence
    assert found.sentence.endswith("run more load generators (workload.clients: 4 or more).")
    # Clients that shared their cores: more of them would not help, more cores would.
    m["conditions"]["client_placement"] = "3 clients share 2 cores (round-robin): ..."
    assert "give the runner more cores (3 clients share 2 cores" in bn.diagnose(m).sentence
    # Send lag alone, and a client with headroom that is not the limit.
    m["conditions"]["clients"][1] = {"index": 1, "cpu_per_wall": 0.1, "send_lag_p99_ms": 80.0}
    assert "sent up to 80 ms late" in bn.diagnose(m).sentence
    m["conditions"]["clients"][1] = {"index": 1} | ok
    assert bn.diagnose(m).cause == "cpu/scheduler"  # the recorded contention, as before


def test_a_client_that_keeps_few_requests_in_flight_names_the_client() -> None:
    """A client held to a fraction of a core: the server ran few of the requests the
    client should have had in flight, and none waited."""
    m = quiet()
    m["server_metrics"] |= {"num_requests_running_mean": 2.4, "num_requests_running_peak": 5.0}
    found = bn.diagnose(m)
    assert found.cause == "client"
    assert "2.4 requests on average of the 8" in found.sentence


def test_an_achieved_rate_below_the_target_names_the_client() -> None:
    m = quiet()
    m["point"]["request_rate"] = 200.0  # 48 prompts in 0.24 s + a ~0.2 s tail: ~109 req/s
    found = bn.diagnose(m)  # measured: 34.5 req/s
    assert found.cause == "client"
    assert "34.52 req/s of the 200 req/s target" in found.sentence
    m["point"]["request_rate"] = 40.0  # 48 in 1.2 s + tail: ~34.6 req/s allowed
    assert bn.diagnose(m).cause == "unknown"


def test_a_traffic_replay_that_fell_behind_names_the_client() -> None:
    m = quiet()
    m["raw"]["traffic"] = {
        "lag": {"p99_ms": 84.0, "max_ms": 90.0, "limit_ms": 20.0, "kept_up": False,
                "late_requests": 9},
    }  # fmt: skip
    found = bn.diagnose(m)
    assert found.cause == "client" and "p99 send lag 84.0 ms" in found.sentence


def test_failures_name_errors_or_the_network() -> None:
    m = recorded() | {"status": "failed", "metrics": {}}
    m["error"] = (
        "aiohttp.ClientConnectorError: Cannot connect to host 127.0.0.1:8000 "
        "[Connection refused]\nthe traceback's other lines"
    )
    found = bn.diagnose(m)
    assert found.cause == "network"
    assert found.sentence.endswith("[Connection refused]")
    m["error"] = "ValueError: max_tokens must be at least 1"
    assert bn.diagnose(m) == bn.Bottleneck(
        "errors",
        "The point failed, so nothing else limited it: ValueError: max_tokens must be at least 1",
    )


def test_on_a_gpu_decode_and_prefill_are_told_apart_and_decode_is_an_estimate() -> None:
    m = quiet()
    m["metrics"]["gpu_util"] = 0.93
    found = bn.diagnose(m, roofline_fraction=0.62)
    assert found.cause == "memory-bandwidth-decode (estimate)"
    assert "62% of the memory-bandwidth roofline (an estimate)" in found.sentence
    m["metrics"]["mean_ttft_ms"] = m["metrics"]["mean_e2el_ms"] * 0.7  # long prompts
    found = bn.diagnose(m)
    assert found.cause == "compute-prefill"
    assert "the first token took 70% of each request's time" in found.sentence


def test_on_a_gpu_idle_while_requests_wait_is_the_cpu_side_and_idle_alone_the_load() -> None:
    m = quiet()
    m["metrics"]["gpu_util"] = 0.3
    assert bn.diagnose(m).cause == "client"  # nothing waited: the offered load was the limit
    m["server_metrics"] |= {"num_requests_running_peak": 2.0, "num_requests_waiting_peak": 6.0}
    found = bn.diagnose(m)
    assert found.cause == "cpu/scheduler" and "busy only 30%" in found.sentence


def test_an_hf_baseline_has_no_server_evidence() -> None:
    m = quiet() | {"backend_kind": "hf-sequential", "server_metrics": None}
    found = bn.diagnose(m)
    assert found.cause == "unknown" and "in-process baseline" in found.sentence


def test_repeats_that_disagree_say_how_many_agreed() -> None:
    queue = bn.Bottleneck("scheduler-queue", "Queued.")
    cpu = bn.Bottleneck("cpu/scheduler", "Shared.")
    assert bn.combine([queue, queue]) == queue
    assert bn.combine([cpu, queue, queue]) == bn.Bottleneck(
        "scheduler-queue", "Queued. (2 of 3 repeats)"
    )
    assert bn.combine([]) is None


# ------------------------------------------------------------- the client's own CPU


def test_window_cpu_interpolates_between_samples() -> None:
    samples = [[10.0, 1.0], [11.0, 1.5], [12.0, 2.5]]
    assert conditions.window_cpu(samples, 10.5, 11.5) == pytest.approx(0.75)
    assert conditions.window_cpu(samples, 9.0, 11.0) is None  # not covered
    assert conditions.window_cpu(samples[:1], 10.0, 10.0) is None


def test_the_client_sampler_measures_the_cpu_it_used_in_the_window(tmp_path: Path) -> None:
    """A busy stretch then an idle one: the share over each window is what the process
    really used (on a shared machine a busy thread gets less than a core: the test
    compares with the process's own CPU clock, not with 1.0)."""
    sampler = CpuSampler(interval_s=0.02)
    sampler.start()
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < 0.5:  # busy, as a saturated client
        pass
    t1, c1 = time.perf_counter(), time.process_time()
    time.sleep(0.3)  # idle, as a client waiting on the server
    t2 = time.perf_counter()
    samples = sampler.stop()
    report = tmp_path / "fields.json"
    report.write_text(json.dumps({"client_cpu": samples}))
    busy = client_cpu(report, {"t0": t0, "window": [0.05, t1 - t0 - 0.05]})
    idle = client_cpu(report, {"t0": t1, "window": [0.05, t2 - t1 - 0.05]})
    direct = (c1 - c0) / (t1 - t0)
    assert abs(busy["client_cpu_per_wall"] - direct) < 0.25, (busy, direct)
    assert idle["client_cpu_per_wall"] < 0.2, idle
    assert busy["client_cpu_per_wall"] > idle["client_cpu_per_wall"]
    assert client_cpu(tmp_path / "missing.json", {"t0": t0, "window": [0, 1]}) == {}


def test_the_client_cpu_keys_pass_the_document_schema() -> None:
    m = copy.deepcopy(recorded())
    m["conditions"] |= {"client_cpu_s": 0.4, "client_cpu_per_wall": 0.29}
    Measurement.model_validate(m)
