"""Several load generators' results as one measurement: an exact merge, and each client's
saturation evidence.

**The merge** (``merge``) reads the clients' ``--save-result --save-detailed`` files one at
a time and keeps only the per-request arrays (``runners.vllm_bench.PER_REQUEST_KEYS``) of
the union, which the measurement carries anyway, plus each client's own summary. The
merged metrics follow vLLM's ``calculate_metrics`` definitions over the union of the
requests, so a merge of one client's file gives that client's own numbers:

- latencies (TTFT, TPOT, ITL, E2EL): mean, median, std and the 50/90/99th percentiles
  (``numpy.percentile``, linear) over every successful request of every client (every
  inter-token gap for ITL; TPOT of requests with more than one output token);
- throughput over the common window: from the first send of any client to the last
  completion of any client (``start_times`` are ``time.perf_counter`` of each client,
  one host's monotonic clock for local clients); request, output and total token
  throughput are the union's counts over that window; goodput counts the requests within
  every SLO bound, as vLLM does;
- ``max_output_tokens_per_s`` and ``max_concurrent_requests`` over one-second buckets
  of the union, as vLLM buckets them.

**Large points.** With a spill directory (``runners.multiclient`` gives one), a union
past the inline limit (``runners.samplesfile``) keeps its token gaps in a file
(``runners.spilled``), not in memory; the result then carries a reading sample, the full
samples file's name and facts (``samples_full``, ``samples_file``), and the same metrics.

**Per client** (``evidence``): its CPU per wall over its own requests' window (its first
send to its last completion), its run-queue wait per wall (the CPU it wanted but did not
get), its event-loop lag (its send lag against schedule: ``runners.loadgen``), the
requests it sent and its achieved send rate against its target share, and when it was
released at the start barrier. ``skew`` says how far apart the clients were released and
sent their first request. ``runners.bottleneck`` reads these and names a saturated
client; the result document keeps them in ``conditions["clients"]`` and each client's
own metrics in ``raw["clients"]``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runners import samplesfile, spilled
from runners.conditions import window_cpu
from runners.result import LATENCY_METRICS, PERCENTILES, THROUGHPUT_KEYS

DETAIL_KEYS = (
    "input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
    "errors",
)  # fmt: skip
# Summary fields of a client's result that a merge adds up, or takes from the first client.
_SUMMED = ("num_prompts", "max_concurrency")
_FROM_FIRST = (
    "date", "backend", "endpoint_type", "label", "model_id", "tokenizer_id", "burstiness",
)  # fmt: skip


def _ms(values: Sequence[float]) -> dict[str, float]:
    """vLLM's statistics of a latency list in seconds, in ms (0 for an empty list)."""
    import numpy as np  # here: the portal imports this module's callers, not numpy

    data = values or [0.0]
    out = {
        "mean": float(np.mean(data) * 1000),
        "median": float(np.median(data) * 1000),
        "std": float(np.std(data) * 1000),
    }
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(data, p) * 1000)
    return out


def _peaks(starts: list[float], ttfts: list[float], itls: list[list[float]], lats: list[float]):
    """Max output tokens in a one-second bucket and max concurrent requests, as vLLM
    buckets them (from the first successful send)."""
    import numpy as np

    if not starts:
        return 0.0, 0
    t0 = min(starts)
    end = max(s + lat for s, lat in zip(starts, lats, strict=True))
    n = math.ceil(end - t0) + 1
    tokens, running = np.zeros(n), np.zeros(n)
    for s, ttft, gaps, lat in zip(starts, ttfts, itls, lats, strict=True):
        times = np.cumsum([s + ttft, *gaps]) if gaps else np.array([s + ttft])
        idx = (times - t0).astype(int)
        np.add.at(tokens, idx[(idx >= 0) & (idx < n)], 1)
        running[int(s - t0) : int(s + lat - t0) + 1] += 1
    return float(tokens.max()), int(running.max())


def merge(
    paths: Sequence[Path],
    slo: dict[str, float] | None = None,
    reports: Sequence[dict[str, Any]] | None = None,
    target_rate: float | None = None,
    clock_offset: float | None = None,
    spill: Path | None = None,
    inline_limit: int | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The clients' result files (in client order) as one result in vLLM's format, with
    ``clients`` (each one's own summary), ``window`` (first send, last completion) and
    ``skew``; and each client's ``evidence`` from its report (``reports``, in the same
    order; ``target_rate``: each client's share of the point's rate).

    ``clock_offset``: clients on other hosts (Pods on other nodes) have monotonic clocks
    of their own. Each one's ``start_times`` are then moved onto the clock whose
    ``time.time() - time.perf_counter()`` is ``clock_offset`` (the runner's), through the
    pair of clocks the client read at its release; the nodes' wall clocks are taken to
    agree (NTP: the start skew shows how well).

    ``spill``: a directory for a point too large to hold: once the union passes
    ``inline_limit`` numbers (``runners.samplesfile.inline_values()``), its token gaps go
    to a file there as each client is read, never into memory;
    their statistics and peaks are computed from it a chunk at a time (percentiles exact:
    ``runners.spilled``); the full union is written there as the samples file
    (``samples.json.gz``), and the result carries a reading sample of at most about
    ``inline_limit`` numbers, ``samples_full`` and ``samples_file`` instead."""
    union: dict[str, list[Any]] = {k: [] for k in DETAIL_KEYS}
    gaps: spilled.GapWriter | None = None  # once the union passes the limit, with `spill`
    limit = inline_limit if inline_limit is not None else samplesfile.inline_values()
    held = 0  # numbers in the union so far
    merged: dict[str, Any] = {}
    clients: list[dict[str, Any]] = []
    found: list[dict[str, Any]] = []
    released: list[float] = []
    first_sends: list[float] = []
    for i, path in enumerate(paths):
        data = json.loads(Path(path).read_text())
        report = reports[i] if reports is not None else {}
        found.append(evidence(i, data, report, target_rate))
        _start_times(report, data, released, first_sends)
        if clock_offset is not None:
            _onto(data, report, clock_offset)
        n = len(data.get("latencies") or [])
        if spill is not None and gaps is None:  # counted only while it may still spill
            held += samplesfile.values_in({k: data.get(k) for k in DETAIL_KEYS})
            if held > limit:
                gaps = spilled.GapWriter(spill / "itls.f64")
                gaps.extend(union["itls"])  # the earlier clients' gaps, then every later one's
                union["itls"] = []
        for key in DETAIL_KEYS:
            values = data.get(key)
            column = values if isinstance(values, list) and len(values) == n else [None] * n
            if key == "itls" and gaps is not None:
                gaps.extend(column)  # to disk: by far the largest array
            else:
                union[key] += column
        if i == 0:
            merged |= {k: data[k] for k in _FROM_FIRST if k in data}
        for key in _SUMMED:
            if isinstance(data.get(key), int | float):
                merged[key] = merged.get(key, 0) + data[key]
        rate = data.get("request_rate")
        if isinstance(rate, int | float):
            merged["request_rate"] = merged.get("request_rate", 0.0) + rate
        else:
            merged.setdefault("request_rate", rate)
        own = {k: data[k] for k in THROUGHPUT_KEYS if isinstance(data.get(k), int | float)}
        own |= {
            k: data[k]
            for m in LATENCY_METRICS
            for k in (f"mean_{m}_ms", f"median_{m}_ms", f"p99_{m}_ms")
            if isinstance(data.get(k), int | float)
        }
        clients.append(
            {
                "index": i,
                "num_prompts": data.get("num_prompts"),
                "max_concurrency": data.get("max_concurrency"),
                "request_rate": rate,
                "metrics": own,
            }
        )
        del data  # one client's file in memory at a time
    merged |= {"clients": clients, "skew": _skew(released, first_sends)}
    if gaps is None:
        return merged | _metrics(union, slo) | union, found
    assert spill is not None
    stored = gaps.close()
    metrics = _metrics(union, slo, stored)
    samples = spill / "samples.json.gz"
    size, digest = samplesfile.write_file(union | {"itls": stored.lists()}, samples)
    sample, kept = spilled.reading_sample(union, stored, limit, str(spill.name))
    full = {"requests": len(union["latencies"]), "kept": kept, "bytes": size, "sha256": digest}
    merged |= {"samples_full": full, "samples_file": str(samples)}
    stored.path.unlink(missing_ok=True)  # the samples file has them now
    return merged | metrics | sample, found


def _metrics(
    u: dict[str, list[Any]], slo: dict[str, float] | None, stored: spilled.Gaps | None = None
) -> dict[str, Any]:
    ok = [i for i, err in enumerate(u["errors"]) if not err and u["latencies"][i] is not None]
    starts = [u["start_times"][i] for i in ok]
    lats = [u["latencies"][i] for i in ok]
    ttfts = [u["ttfts"][i] for i in ok]
    itl_lists = [list(u["itls"][i] or []) for i in ok] if stored is None else []
    outs = [int(u["output_lens"][i] or 0) for i in ok]
    total_in = sum(int(u["input_lens"][i] or 0) for i in ok)
    total_out = sum(outs)
    tpots, all_tpots = [], []
    for lat, ttft, n in zip(lats, ttfts, outs, strict=True):
        tpot = (lat - ttft) / (n - 1) if n > 1 else 0.0
        if n > 1:
            tpots.append(tpot)
        all_tpots.append(tpot)
    first = min(starts) if starts else 0.0
    last = max((s + lat for s, lat in zip(starts, lats, strict=True)), default=0.0)
    duration = max(last - first, 1e-9)
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(u["errors"]) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "request_goodput": None,
        "window": [first, last],
    }
    if slo:
        bounds = {"ttft": ttfts, "tpot": all_tpots, "e2el": lats}
        used = [(bounds[k.removesuffix("_ms")], v / 1000) for k, v in slo.items()]
        good = sum(1 for j in range(len(ok)) if all(values[j] <= bound for values, bound in used))
        out["request_goodput"] = good / duration
    series: dict[str, Any] = {"ttft": ttfts, "tpot": tpots, "e2el": lats}
    if stored is None:
        series["itl"] = [g for gaps in itl_lists for g in gaps]
    for name, values in series.items():
        for stat, value in _ms(values).items():
            out[f"{stat}_{name}_ms"] = value
    if stored is None:
        out["max_output_tokens_per_s"], out["max_concurrent_requests"] = _peaks(
            starts, ttfts, itl_lists, lats
        )
        return out
    for stat, value in stored.statistics(ok, PERCENTILES).items():
        out[f"{stat}_itl_ms"] = value * 1000
    out["max_output_tokens_per_s"], out["max_concurrent_requests"] = stored.peaks(
        ok, starts, ttfts, lats
    )
    return out


def evidence(
    index: int, result: dict[str, Any], report: dict[str, Any], target_rate: float | None
) -> dict[str, Any]:
    """One client's saturation evidence (module docstring) from its result file's arrays
    and its report (``runners.bench_client``: CPU and wait samples, start, loop lag)."""
    starts = [s for s in result.get("start_times") or [] if isinstance(s, int | float)]
    lats = result.get("latencies") or []
    ends = [s + lat for s, lat in zip(starts, lats, strict=False) if isinstance(lat, int | float)]
    facts: dict[str, Any] = {"index": index, "requests": len(starts)}
    start = report.get("start") or {}
    if "late_ms" in start:
        facts["start_late_ms"] = start["late_ms"]
    if lag := report.get("loop_lag"):
        facts["send_lag_p99_ms"] = lag.get("p99_ms")
        facts["send_lag_max_ms"] = lag.get("max_ms")
    if not starts or not ends:
        return facts
    first, last = min(starts), max(ends)
    wall = last - first
    if wall > 0:
        facts["achieved_rate"] = round(len(ends) / wall, 3)
        if cpu := window_cpu(report.get("client_cpu") or [], first, last):
            facts["cpu_per_wall"] = round(cpu / wall, 3)
        if (wait := window_cpu(report.get("client_wait") or [], first, last)) is not None:
            facts["wait_per_wall"] = round(wait / wall, 3)
    if target_rate and len(starts) > 1 and (sent := max(starts) - first) > 0:
        facts["target_rate"] = round(target_rate, 3)
        facts["send_rate"] = round((len(starts) - 1) / sent, 3)
    return facts


def _start_times(
    report: dict[str, Any], result: dict[str, Any], released: list[float], first: list[float]
) -> None:
    """Append this client's release and first send on the wall clock (through the pair of
    clocks it read at its release)."""
    start = report.get("start") or {}
    at, perf = start.get("released_at"), start.get("released_perf")
    if not isinstance(at, int | float) or not isinstance(perf, int | float):
        return
    released.append(at)
    starts = [s for s in result.get("start_times") or [] if isinstance(s, int | float)]
    if starts:
        first.append(min(starts) - perf + at)


def _onto(data: dict[str, Any], report: dict[str, Any], clock_offset: float) -> None:
    """This client's ``start_times`` on the clock of ``clock_offset`` (``merge``)."""
    start = report.get("start") or {}
    at, perf = start.get("released_at"), start.get("released_perf")
    starts = data.get("start_times")
    if not isinstance(at, int | float) or not isinstance(perf, int | float):
        return
    if isinstance(starts, list):
        delta = (at - perf) - clock_offset
        data["start_times"] = [s + delta if isinstance(s, int | float) else s for s in starts]


def _skew(released: list[float], first_sends: list[float]) -> dict[str, float]:
    """How far apart the clients were released at the barrier and sent their first
    request (ms)."""
    out = {}
    if len(released) > 1:
        out["release_ms"] = round((max(released) - min(released)) * 1000, 3)
    if len(first_sends) > 1:
        out["first_send_ms"] = round((max(first_sends) - min(first_sends)) * 1000, 3)
    return out
