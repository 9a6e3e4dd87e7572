"""Client metrics from per-request timings, with vLLM's bench definitions.

The HF baseline times its own requests; to sit on the same chart as vLLM it must compute
the same numbers the same way as ``vllm.benchmarks.serve.calculate_metrics``:

- TTFT: request start to first token.
- TPOT: per request, ``(latency - ttft) / (output_len - 1)``; requests with one token are
  left out. Its statistics are over requests.
- ITL: every gap between consecutive tokens, pooled over all requests; its statistics
  are over gaps, not requests.
- E2EL: request start to last token.
- Percentiles: numpy's default (linear interpolation), reported in milliseconds as
  ``mean_/median_/std_/p50_/p90_/p99_<metric>_ms``.
- Throughputs divide by the wall time of the whole timed loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from runners.result import PERCENTILES


def _stats(name: str, values_s: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values_s if len(values_s) else [0.0], dtype=float) * 1000.0
    out = {
        f"mean_{name}_ms": float(np.mean(arr)),
        f"median_{name}_ms": float(np.median(arr)),
        f"std_{name}_ms": float(np.std(arr)),
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(arr, p))
    return out


def client_metrics(
    *,
    input_lens: Sequence[int],
    output_lens: Sequence[int],
    ttfts: Sequence[float],
    itls: Sequence[Sequence[float]],
    latencies: Sequence[float],
    duration: float,
) -> dict[str, float]:
    """METRIC_KEYS for a set of successful requests (times in seconds, output in ms)."""
    if duration <= 0:
        raise ValueError("duration must be positive")
    tpots = [
        (lat - ttft) / (out - 1)
        for lat, ttft, out in zip(latencies, ttfts, output_lens, strict=True)
        if out > 1
    ]
    gaps = [gap for request in itls for gap in request]
    total_in, total_out = int(sum(input_lens)), int(sum(output_lens))
    metrics: dict[str, float] = {
        "duration": float(duration),
        "completed": float(len(latencies)),
        "failed": 0.0,
        "total_input_tokens": float(total_in),
        "total_output_tokens": float(total_out),
        "request_throughput": len(latencies) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    metrics |= _stats("ttft", ttfts)
    metrics |= _stats("tpot", tpots)
    metrics |= _stats("itl", gaps)
    metrics |= _stats("e2el", latencies)
    return metrics
