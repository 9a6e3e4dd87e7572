"""The NVML path on a recorded session (no GPU here): ``runners.nvml`` reads the recording
through pynvml's own call names (``nvmlreplay``), turns it into series and sums energy.

The recording in ``data/`` is synthetic (shaped like two H200s during a short point) until
a session with a GPU records a real one with ``python -m runners gpu-check --record``:
this path is unverified on hardware.
"""

from __future__ import annotations

import time

import pynvml
import pytest
from nvmlreplay import Replay, recording

from runners import nvml


def replayed_readings(data: dict, reads: int) -> tuple[nvml.GPUs, list]:
    gpus = nvml.GPUs.open(Replay(data))
    return gpus, [gpus.read() for _ in range(reads)]


def test_it_reads_every_field_of_every_gpu_as_nvml_returned_it():
    data = recording()
    gpus, readings = replayed_readings(data, len(data["samples"]))
    assert [d.name for d in gpus.devices] == ["NVIDIA H200", "NVIDIA H200"]
    assert gpus.devices[0].power_limit_w == 700.0
    assert gpus.devices[1].uuid == data["devices"][1]["uuid"]
    assert readings == [s["gpus"] for s in data["samples"]]
    gpus.close()
    assert gpus.lib.initialised == 0


def test_a_field_the_gpu_does_not_support_reads_none_and_is_not_asked_again():
    data = recording()
    for sample in data["samples"]:
        sample["gpus"][1]["energy_mj"] = None  # a board without the energy counter
    gpus, readings = replayed_readings(data, 3)
    calls_after_first = gpus.lib.calls
    gpus.read()
    per_read = gpus.lib.calls - calls_after_first
    assert [r[1]["energy_mj"] for r in readings] == [None, None, None]
    assert readings[0][0]["energy_mj"] == data["samples"][0]["gpus"][0]["energy_mj"]
    # Nine fields per GPU and read; the GPU without a counter is not asked for it again.
    assert per_read == 9 + 8


def test_the_series_are_in_display_units_and_count_from_the_first_sample():
    data = recording()
    series = nvml.series_from_recording(data, t0=data["samples"][0]["t"])
    assert series["t"][:3] == [0.0, 0.1, 0.2]
    first = data["samples"][0]["gpus"][0]
    assert series["power_w"][0][0] == first["power_mw"] / 1000
    assert series["energy_j"][0][0] == 0.0
    last = data["samples"][-1]["gpus"][0]["energy_mj"]
    assert series["energy_j"][0][-1] == pytest.approx((last - first["energy_mj"]) / 1000)
    assert series["memory_used_mib"][1][10] == pytest.approx(
        data["samples"][10]["gpus"][1]["memory_used_bytes"] / 2**20, abs=1e-3
    )
    assert series["gpu_util"][0][20] == 100
    assert series["clock_reasons"][0][0] == 0x1


def test_energy_over_a_window_is_the_counters_difference_summed_over_gpus():
    data = recording()
    series = nvml.series_from_recording(data, t0=data["samples"][0]["t"])
    window = (1.0, 3.0)  # samples 10 and 30: at full load
    summary = nvml.summarize(series, window)
    expected = sum(
        (data["samples"][30]["gpus"][g]["energy_mj"] - data["samples"][10]["gpus"][g]["energy_mj"])
        / 1000
        for g in (0, 1)
    )
    assert summary["gpus"] == 2
    assert summary["energy_source"] == "counter"
    assert summary["energy_j"] == pytest.approx(expected)
    assert summary["avg_power_w"] == pytest.approx(expected / 2.0)
    assert 1200 < summary["avg_power_w"] < 1420  # two boards near 600-700 W
    assert summary["peak_power_w"] == 1400.0  # both at the 700 W cap
    assert summary["samples"] == 21
    assert 0.99 <= summary["gpu_util"] <= 1.0
    assert summary["temperature_max_c"] == 59
    assert summary["sm_clock_mhz"] < 1980  # the capped stretch clocked down
    assert summary["clock_reasons"] == ["sw_power_cap"]
    assert summary["memory_used_peak_bytes"] > 2 * 130e9


def test_a_window_between_samples_is_interpolated():
    data = recording()
    series = nvml.series_from_recording(data, t0=data["samples"][0]["t"])
    whole = nvml.summarize(series, (1.0, 3.0))["energy_j"]
    halves = sum(nvml.summarize(series, w)["energy_j"] for w in ((1.0, 2.05), (2.05, 3.0)))
    assert halves == pytest.approx(whole)


def test_without_the_counter_energy_is_the_integral_of_power():
    data = recording()
    for sample in data["samples"]:
        for gpu in sample["gpus"]:
            gpu["energy_mj"] = None
    series = nvml.series_from_recording(data, t0=data["samples"][0]["t"])
    summary = nvml.summarize(series, (1.0, 3.0))
    assert summary["energy_source"] == "power integral"
    with_counter = nvml.summarize(
        nvml.series_from_recording(recording(), t0=data["samples"][0]["t"]), (1.0, 3.0)
    )
    # The synthetic counter runs 1% ahead of the power samples (a finer-grained integral).
    assert summary["energy_j"] == pytest.approx(with_counter["energy_j"] / 1.01, rel=0.01)


def test_the_sampler_reads_in_its_own_thread_and_keeps_the_raw_readings():
    data = recording()
    replay = Replay(data)
    with nvml.Sampler(interval_s=0.01, lib=replay) as sampler:
        deadline = time.monotonic() + 30  # 10 samples at 10 ms, on a loaded machine too
        while len(sampler.recording()["samples"]) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sampler.available and sampler.status == "ok"
    raw = sampler.recording()["samples"]
    assert len(raw) >= 10
    assert [s["gpus"] for s in raw[:5]] == [s["gpus"] for s in data["samples"][:5]]
    series = sampler.series()
    assert series["status"] == "ok" and len(series["t"]) == len(raw)
    assert series["t"] == sorted(series["t"]) and series["t"][0] >= 0
    assert sampler.memory_peak_bytes() == max(
        sum(g["memory_used_bytes"] for g in s["gpus"]) for s in raw
    )
    assert sampler.cpu_s >= 0 and replay.initialised == 0


@pytest.mark.parametrize(
    ("visible", "chosen"),
    [(None, [0, 1]), ("1", [1]), ("GPU-5f1c9e2a-0d4b-4c1e-9a7e-000000000000", [0])],
)
def test_it_reads_the_gpus_cuda_would_use(visible, chosen):
    gpus = nvml.GPUs.open(Replay(recording()), visible)
    assert [d.index for d in gpus.devices] == chosen
    assert gpus.note == ""


@pytest.mark.parametrize("visible", ["-1", "MIG-3c1f8d0a-0000", "0,0"])
def test_a_value_that_hides_every_gpu_reads_none_and_says_why(visible):
    """CUDA's rules (runners.gpu_scope): '-1' and a MIG UUID no instance has end the list
    at once, a GPU listed twice makes it invalid. Reading every GPU instead would count
    GPUs the run did not use in its energy and cost."""
    with pytest.raises(nvml.NVMLUnavailable, match="no GPU is visible") as caught:
        nvml.GPUs.open(Replay(recording()), visible)
    assert f"CUDA_VISIBLE_DEVICES={visible!r}" in str(caught.value)


def test_the_list_ends_at_an_invalid_entry_and_the_note_says_so():
    gpus = nvml.GPUs.open(Replay(recording()), "1,5,0")
    assert [d.index for d in gpus.devices] == [1]
    assert "the list ends at '5' (this host has no GPU 5)" in gpus.note


def test_a_mig_instance_is_read_through_its_whole_gpu_and_said_so():
    data = recording()
    mig = "MIG-3c1f8d0a-0000-5a36-8b4d-9b07d024b1bb"
    data["devices"][1]["mig"] = [{"uuid": mig, "gpu_instance_id": 1, "compute_instance_id": 0}]
    gpus = nvml.GPUs.open(Replay(data), "MIG-3c1f8d0a")
    assert [d.index for d in gpus.devices] == [1]
    assert f"MIG instance {mig}: its whole GPU is read" in gpus.note


def test_no_visible_gpu_or_no_driver_is_not_measured_with_the_reason():
    with pytest.raises(nvml.NVMLUnavailable, match="no GPU is visible"):
        nvml.GPUs.open(Replay(recording()), "")
    replay = Replay(recording(), init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with nvml.Sampler(lib=replay) as sampler:
        pass
    assert not sampler.available
    assert sampler.status == f"{nvml.NOT_MEASURED}: NVML did not initialise: Driver Not Loaded"
    assert sampler.series() == {"status": sampler.status}


def test_the_real_library_says_whether_this_machine_can_be_read():
    # The project's CPU machines have no NVIDIA driver: pynvml itself cannot initialise.
    with nvml.Sampler() as sampler:
        pass
    if sampler.available:
        assert sampler.status == "ok" and sampler.devices
    else:
        assert sampler.status.startswith(nvml.NOT_MEASURED + ": ")
        assert sampler.memory_peak_bytes() is None and sampler.cpu_s == 0.0


def test_clock_event_reasons_are_named():
    assert nvml.reason_names(0x1 | 0x4 | 0x40) == [
        "gpu_idle",
        "sw_power_cap",
        "hw_thermal_slowdown",
    ]
