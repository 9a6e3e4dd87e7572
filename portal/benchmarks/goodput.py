"""Goodput: requests per second that met the run's SLO (vLLM's ``request_goodput``).

vLLM's bench client computes it when given ``--goodput`` (the runner passes the spec's
SLO): a request is good when its TTFT, its TPOT ((latency - TTFT) / (output tokens - 1))
and its end-to-end latency are each within the SLO values given; goodput is good
requests over the benchmark's duration. ``from_detail`` recomputes exactly that from the
per-request arrays when the client did not report it (an older client, or an SLO added
to the spec after the run). ``slo_attainment`` is the fraction of completed requests
that were good.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar


class _HasMetrics(Protocol):
    def get(self, key: str) -> float | None: ...


T = TypeVar("T", bound=_HasMetrics)


def from_metrics(metrics: Mapping[str, Any]) -> dict[str, float] | None:
    """The client's own goodput, with the attainment it implies; None if not reported."""
    good = metrics.get("request_goodput")
    total = metrics.get("request_throughput")
    if not isinstance(good, int | float) or isinstance(good, bool):
        return None
    out = {"request_goodput": float(good)}
    if isinstance(total, int | float) and total > 0:
        out["slo_attainment"] = min(1.0, float(good) / float(total))
    return out


def is_good(ttft_s: float, latency_s: float, output_len: int, slo: Mapping[str, float]) -> bool:
    """vLLM's rule: every SLO given is met (values in ms, request timings in s)."""
    tpot_s = (latency_s - ttft_s) / (output_len - 1) if output_len > 1 else 0.0
    checks = {"ttft_ms": ttft_s, "tpot_ms": tpot_s, "e2el_ms": latency_s}
    return all(checks[key] * 1000.0 <= limit for key, limit in slo.items() if key in checks)


def from_detail(detail: Mapping[str, Any], slo: Mapping[str, float]) -> dict[str, float] | None:
    """Goodput and attainment from the client's per-request arrays; None if missing. A
    reading sample (``sample_of`` requests in all) counts for the whole point."""
    ttfts = detail.get("ttfts")
    latencies = detail.get("latencies")
    output_lens = detail.get("output_lens")
    duration = _float(detail.get("duration"))
    if not _lists(ttfts, latencies, output_lens) or not duration or duration <= 0:
        return None
    errors: Sequence[Any] = detail.get("errors") or [""] * len(ttfts)
    completed = good = 0
    for i, (ttft, latency, out_len) in enumerate(zip(ttfts, latencies, output_lens, strict=False)):
        if (i < len(errors) and errors[i]) or not out_len:
            continue  # a failed request is never good
        completed += 1
        if is_good(float(ttft), float(latency), int(out_len), slo):
            good += 1
    if not completed:
        return None
    # A reading sample of a larger point (runners.samplesfile): its good share, of all.
    of = detail.get("sample_of")
    scale = of / len(ttfts) if isinstance(of, int) and of > len(ttfts) else 1.0
    return {"request_goodput": good * scale / duration, "slo_attainment": good / completed}


def best_point(points: Sequence[T]) -> T | None:
    """The point with the highest goodput (the lower one on a tie); None without goodput."""
    best: T | None = None
    for point in points:
        value = point.get("request_goodput")
        if value is None or value <= 0:
            continue
        current = best.get("request_goodput") if best is not None else None
        if current is None or value > current:
            best = point
    return best


def _lists(*values: Any) -> bool:
    return all(isinstance(v, list) and v for v in values)


def _float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
