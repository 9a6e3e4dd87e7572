"""A measurement's telemetry and the figures derived from it (runners.telemetry), on a
recorded NVML session replayed through pynvml's calls."""

from __future__ import annotations

import time

import pytest
from nvmlreplay import Replay, recording

from runners import nvml
from runners import telemetry as tm
from runners.result import ENERGY_KEYS, Measurement


def detail_with_requests(sent: list[float], latency: float = 0.5) -> dict:
    return {"start_times": sent, "latencies": [latency] * len(sent), "output_lens": [32] * 4}


def test_the_requests_window_runs_from_the_first_sent_to_the_last_done():
    detail = {"start_times": [10.0, 10.2, 10.4, 11.0], "latencies": [0.5, 0.9, 0.0, 0.3]}
    assert tm.requests_of(detail) == [(10.0, 10.5), (10.2, 11.1), (11.0, 11.3)]  # failed: 0
    assert tm.requests_of({}) == []


def replayed_telemetry(sent: list[float]) -> dict:
    """A point whose requests ran while a replayed two-GPU session was sampled."""
    with nvml.Sampler(interval_s=0.005, lib=Replay(recording())) as gpu:
        deadline = time.monotonic() + 5
        while len(gpu.recording()["samples"]) < 40 and time.monotonic() < deadline:
            time.sleep(0.005)
    t0 = gpu.t0 or 0.0
    last = gpu.recording()["samples"][-1]["t"]
    # Requests inside the sampled span, on the same clock.
    span = last - t0
    return tm.assemble(gpu, t0, detail_with_requests([t0 + span * f for f in sent], span * 0.1))


def test_assembled_telemetry_carries_series_requests_window_and_gpu_summary():
    telemetry = replayed_telemetry([0.2, 0.3, 0.4, 0.5])
    assert telemetry["version"] == 1 and telemetry["clock"] == "perf_counter"
    lo, hi = telemetry["window"]
    assert telemetry["requests"]["sent"][0] == lo < hi == max(telemetry["requests"]["done"])
    gpu = telemetry["gpu"]
    assert gpu["status"] == "ok" and len(gpu["devices"]) == 2 and gpu["t"][0] >= 0
    summary = telemetry["summary"]
    assert summary["gpus"] == 2 and summary["energy_source"] == "counter"
    assert summary["energy_j"] > 0 and summary["avg_power_w"] > 0
    assert telemetry["sampler"]["nvml_interval_s"] == 0.005
    assert "server" not in telemetry  # the HF baseline has no /metrics


def test_a_reading_samples_window_is_the_whole_points_when_its_bounds_are_given():
    """A reading sample (runners.samplesfile) misses the point's first and last requests:
    the merge's exact window replaces its own, so the GPU summary covers every request."""
    with nvml.Sampler(interval_s=0.005, lib=Replay(recording())) as gpu:
        deadline = time.monotonic() + 5
        while len(gpu.recording()["samples"]) < 40 and time.monotonic() < deadline:
            time.sleep(0.005)
    t0 = gpu.t0 or 0.0
    span = gpu.recording()["samples"][-1]["t"] - t0
    sample = detail_with_requests([t0 + span * 0.4, t0 + span * 0.5], span * 0.1)
    own = tm.assemble(gpu, t0, sample)
    whole = tm.assemble(gpu, t0, sample, bounds=[t0 + span * 0.1, t0 + span * 0.9])
    assert own["window"] == pytest.approx([span * 0.4, span * 0.6], abs=2e-4)
    assert whole["window"] == pytest.approx([span * 0.1, span * 0.9], abs=2e-4)
    assert whole["requests"] == own["requests"]
    assert whole["summary"]["energy_j"] > own["summary"]["energy_j"]


def test_derived_energy_and_cost_follow_from_the_summary_and_the_metrics():
    telemetry = {"summary": {"gpus": 2, "energy_j": 300.0, "avg_power_w": 1200.0, "gpu_util": 0.9}}
    metrics = {"total_output_tokens": 1500.0, "output_throughput": 6000.0}
    derived = tm.derive(telemetry, metrics, price_per_gpu_hour=3.6)
    assert derived["energy_per_output_token_j"] == pytest.approx(0.2)
    assert derived["avg_power_w"] == 1200.0 and derived["gpu_util"] == 0.9
    # 2 GPUs x 3.6 per hour = 0.002 per second; 10^6 tokens take 10^6 / 6000 s.
    assert derived["cost_per_million_output_tokens"] == pytest.approx(0.002 * 1e6 / 6000)
    assert set(derived) == set(ENERGY_KEYS)


def test_without_nvml_nothing_is_derived_and_without_a_price_no_cost():
    metrics = {"total_output_tokens": 1500.0, "output_throughput": 6000.0}
    assert tm.derive({"gpu": {"status": "not measured (no NVML): ..."}}, metrics) == {}
    assert tm.derive({}, metrics, price_per_gpu_hour=2.0) == {}  # GPU count unknown
    assert tm.derive({}, metrics, price_per_gpu_hour=2.0, gpus=1) == {
        "cost_per_million_output_tokens": pytest.approx(2.0 / 3600 / 6000 * 1e6)
    }
    summary = {"summary": {"gpus": 1, "energy_j": 10.0}}
    assert "cost_per_million_output_tokens" not in tm.derive(summary, metrics)


def test_the_sampler_cost_is_a_share_of_the_points_cpu_time():
    telemetry = {"sampler": {"nvml_cpu_s": 0.02, "metrics_cpu_s": 0.03, "scrapes": 10}}
    tm.sampler_share(telemetry, 10.0)
    assert telemetry["sampler"]["cpu_s"] == 0.05
    assert telemetry["sampler"]["share_of_point_cpu"] == pytest.approx(0.005)


def test_a_measurement_keeps_its_telemetry_through_the_result_document():
    telemetry = replayed_telemetry([0.2, 0.4])
    m = Measurement(
        backend="hf",
        backend_kind="hf-sequential",
        point={
            "key": "baseline",
            "sweep": "baseline",
            "input_len": 8,
            "output_len": 4,
            "max_concurrency": 1,
            "num_prompts": 2,
        },
        repeat=0,
        status="succeeded",
        telemetry=telemetry,
        started_at="2026-11-30T00:00:00+00:00",
        finished_at="2026-11-30T00:00:01+00:00",
        duration_s=1.0,
    )
    again = Measurement.model_validate_json(m.model_dump_json())
    assert again.telemetry == telemetry
