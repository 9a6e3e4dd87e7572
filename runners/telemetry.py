"""What the hardware did during one measurement, and the figures a team decides with.

A measurement's ``telemetry`` (``runners.result.Measurement.telemetry``; the portal keeps
it in object storage next to the per-request samples):

    {
      "version": 1,
      "clock": "perf_counter",     # CLOCK_MONOTONIC: the clock of the bench client's
                                   # start_times and of the HF loop's
      "t0": 81234.5,               # that clock at the series' t = 0 (sampling began)
      "requests": {"sent": [...], "done": [...]},   # s after t0, per request
      "window": [3.1, 9.8],        # s after t0: first request sent to last one done
      "server": {...},             # vLLM's /metrics series (runners.server_metrics)
      "gpu": {...},                # NVML series (runners.nvml), or {"status": "not
                                   # measured (no NVML): <why>"}
      "summary": {...},            # runners.nvml.summarize over the window
      "sampler": {...}             # what sampling cost: thread CPU time, scrapes
    }

``derive`` turns it into metrics (``DERIVED_KEYS``), one rule for the runner (spec price)
and the portal (the spec's price, else the admin's default per GPU type):

- ``energy_per_output_token_j``: all GPUs' energy over the window / output tokens;
- ``avg_power_w``: that energy / the window; ``gpu_util``: mean NVML utilisation (0..1);
- ``cost_per_million_output_tokens``: price per GPU-hour x GPUs / (3,600 x output
  tokens/s) x 10^6: what a million tokens cost at this point's throughput, GPUs billed
  whole (the idle ones of a multi-GPU node included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from runners import nvml
from runners.result import ENERGY_KEYS

VERSION = 1
CLOCK = "perf_counter"
DERIVED_KEYS = ENERGY_KEYS
NOT_MEASURED = nvml.NOT_MEASURED


def requests_of(detail: Mapping[str, Any]) -> list[tuple[float, float]]:
    """(sent, done) per completed request on the client's clock, from the bench client's
    (or the HF loop's) ``start_times`` and ``latencies``."""
    starts = detail.get("start_times") or []
    latencies = detail.get("latencies") or []
    return [
        (float(s), float(s) + float(lat))
        for s, lat in zip(starts, latencies, strict=False)
        if isinstance(s, int | float) and isinstance(lat, int | float) and lat > 0
    ]


def assemble(
    gpu: nvml.Sampler,
    t0: float,
    detail: Mapping[str, Any],
    *,
    server: Mapping[str, Any] | None = None,
    sampler: Mapping[str, Any] | None = None,
    bounds: Sequence[float] | None = None,
) -> dict[str, Any]:
    """One measurement's telemetry. ``t0``: the series' zero on ``CLOCK``; ``detail``:
    the per-request arrays, whose send and finish times become ``requests`` and
    ``window`` (first sent to last done) on the series' axis. ``bounds``: the requests'
    first send and last completion on the client's clock when ``detail`` is a reading
    sample of them (``runners.samplesfile``), whose own window would be narrower."""
    series = gpu.series()
    if series.get("t") is not None and gpu.t0 is not None:
        shift = gpu.t0 - t0  # the GPU series counts from its own start
        series["t"] = [round(t + shift, 4) for t in series["t"]]
    out: dict[str, Any] = {"version": VERSION, "clock": CLOCK, "t0": t0, "gpu": series}
    done = requests_of(detail)
    if done:
        out["requests"] = {
            "sent": [round(a - t0, 4) for a, _ in done],
            "done": [round(b - t0, 4) for _, b in done],
        }
        window = (min(out["requests"]["sent"]), max(out["requests"]["done"]))
        if bounds is not None and len(bounds) == 2:
            window = (round(bounds[0] - t0, 4), round(bounds[1] - t0, 4))
        out["window"] = list(window)
        if gpu.available:
            out["summary"] = nvml.summarize(series, window)
    if server is not None:
        out["server"] = dict(server)
    cost = {"nvml_cpu_s": round(gpu.cpu_s, 4), "nvml_interval_s": gpu.interval_s}
    out["sampler"] = {**cost, **(sampler or {})}
    return out


def sampler_share(telemetry: dict[str, Any], point_cpu_s: Any) -> None:
    """Record the sampler's CPU time as a share of the measured processes' CPU time."""
    sampler = telemetry.get("sampler") or {}
    spent = math.fsum(
        float(v) for k, v in sampler.items() if k.endswith("_cpu_s") and isinstance(v, int | float)
    )
    sampler["cpu_s"] = round(spent, 4)
    if isinstance(point_cpu_s, int | float) and point_cpu_s > 0:
        sampler["share_of_point_cpu"] = round(spent / point_cpu_s, 5)


def gpu_count(telemetry: Mapping[str, Any]) -> int | None:
    """How many GPUs the telemetry watched (None without NVML)."""
    summary = telemetry.get("summary") or {}
    count = summary.get("gpus")
    return count if isinstance(count, int) and count > 0 else None


def cost_per_million(price_per_gpu_hour: float, gpus: int, output_throughput: float) -> float:
    """Price of 10^6 output tokens at ``output_throughput`` tok/s on ``gpus`` GPUs."""
    return price_per_gpu_hour * gpus / (3600.0 * output_throughput) * 1e6


def derive(
    telemetry: Mapping[str, Any] | None,
    metrics: Mapping[str, Any],
    *,
    price_per_gpu_hour: float | None = None,
    gpus: int | None = None,
) -> dict[str, float]:
    """The derived metrics (``DERIVED_KEYS``) this measurement supports; absent ones
    were not measured. ``gpus`` defaults to the GPUs the telemetry watched."""
    telemetry = telemetry or {}
    summary = telemetry.get("summary") or {}
    out: dict[str, float] = {}
    tokens = _positive(metrics.get("total_output_tokens"))
    energy = _positive(summary.get("energy_j"))
    if energy is not None and tokens is not None:
        out["energy_per_output_token_j"] = energy / tokens
    for key in ("avg_power_w", "gpu_util"):
        value = summary.get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            out[key] = float(value)
    count = gpus or gpu_count(telemetry)
    throughput = _positive(metrics.get("output_throughput"))
    if price_per_gpu_hour is not None and price_per_gpu_hour > 0 and count and throughput:
        out["cost_per_million_output_tokens"] = cost_per_million(
            float(price_per_gpu_hour), count, throughput
        )
    return out


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None
