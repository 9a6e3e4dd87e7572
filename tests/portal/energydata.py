"""Measurements with telemetry for the energy and cost tests (pages, compare, browser).

A real tiny-model vLLM point measured on this project's CPU machines (its /metrics series,
request times, no NVML: ``data/tiny-vllm-c8-point.json``), and for the GPU case the same
point with the synthetic two-GPU NVML recording (``tests/runners/data``) laid over its
requests: the NVML path is unverified on hardware.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from portal.benchmarks import ingestion
from runners import nvml
from runners import result as rr

DATA = Path(__file__).parent / "data"
RECORDING = Path(__file__).parents[1] / "runners" / "data" / "nvml-2xh200-synthetic.json"
POINT = "concurrency:max_concurrency=8"
J_PER_TOKEN = "energy_per_output_token_j"
COST = "cost_per_million_output_tokens"


def point_spec(spec_dict: Any) -> dict[str, Any]:
    return spec_dict(
        workload={"input_len": 128, "output_len": 32, "num_prompts": 48, "num_warmups": 1},
        sweeps=[{"name": "concurrency", "axis": "max_concurrency", "values": [8]}],
    )


def cpu_point() -> dict[str, Any]:
    """The real tiny-model point (vLLM on 2 CPU cores: no NVML)."""
    return json.loads((DATA / "tiny-vllm-c8-point.json").read_text())


def with_gpus(body: dict[str, Any], load: float = 1.0) -> dict[str, Any]:
    """``body`` with the recorded NVML session over its requests' window: the recording's
    full-load stretch (1 s to 3 s after its start) laid on the window, power x ``load``."""
    body = copy.deepcopy(body)
    recording = json.loads(RECORDING.read_text())
    for sample in recording["samples"]:
        for gpu in sample["gpus"]:
            gpu["power_mw"] = int(gpu["power_mw"] * load)
    telemetry = body["telemetry"]
    lo, hi = telemetry["window"]
    first = recording["samples"][0]["t"]
    scale = (hi - lo) / 2.0  # the recording's 1 s..3 s onto the window
    series = nvml.series_from_recording(recording, first)
    series["t"] = [round(lo + (t - 1.0) * scale, 4) for t in series["t"]]
    series["energy_j"] = [[e * load for e in column] for column in series["energy_j"]]
    telemetry["gpu"] = {**series, "status": "ok"}
    telemetry["summary"] = nvml.summarize(telemetry["gpu"], (lo, hi))
    return body


def hf_body(measurement: Any, telemetry: dict[str, Any]) -> dict[str, Any]:
    """An HF baseline point: 4 requests, 10x the vLLM point's joules per token."""
    body = measurement("hf-sequential", "baseline")
    body["metrics"] |= {"total_output_tokens": 64.0, "output_throughput": 60.0}
    body["telemetry"] = hf = copy.deepcopy(telemetry)
    del hf["server"]  # no /metrics: a loop in a child process
    lo, hi = hf["window"]
    step = (hi - lo) / 4
    hf["requests"] = {
        "sent": [round(lo + i * step, 4) for i in range(4)],
        "done": [round(lo + (i + 1) * step, 4) for i in range(4)],
    }
    vllm_j = telemetry["summary"]["energy_j"] / 1536.0
    hf["summary"]["energy_j"] = vllm_j * 10 * 64.0
    return body


def ingest(run: Any, body: dict[str, Any]) -> Any:
    row, created = ingestion.ingest_measurement(run, rr.Measurement.model_validate(body))
    assert created
    return row
