"""What limited one point, in one sentence with its evidence.

A throughput number says how fast; a reader deciding what to change needs to know what
held the point back. ``diagnose(measurement)`` reads only what the measurement recorded
(a result document's measurement, or the portal's row through the same keys) and returns
a ``Bottleneck``: a ``cause`` and a sentence quoting the numbers that decided it. Causes:

- ``errors`` / ``network``: the point failed; ``network`` when the first cause is a
  connection that was refused, reset, timed out or could not be resolved.
- ``cpu/scheduler``: something competed for the server's cores (``runners.conditions``
  said it was contended: other processes, CPU steal, quota throttling), or on a GPU the
  GPU sat mostly idle (``gpu_util`` below ``GPU_IDLE``) while requests waited: the CPU
  side (scheduler, tokenisation, the Python server) could not feed it.
- ``client``: the load generator itself: its own CPU time over the requests' window at
  ``CLIENT_SATURATED`` of a core or more (``conditions.client_cpu_per_wall``; vLLM's
  client is one asyncio thread), a traffic replay that fell behind its timestamps, an
  achieved request rate below ``RATE_SHORTFALL`` of what the target rate allows while
  nothing waited at the server, or the server running on average under ``CLIENT_FILL``
  of the client's concurrency with nothing waiting (the client did not keep its requests
  in flight). On a GPU, a GPU under ``GPU_IDLE`` busy with nothing waiting: the offered
  load (concurrency, rate) was the limit, not the server.
  Per client (``conditions["clients"]``, ``runners.clientmerge.evidence``; one entry per
  load generator, several with ``workload.clients``): a client whose CPU plus run-queue
  wait per wall reached ``CLIENT_DEMAND`` (it wanted a whole core: busy, or ready and
  waiting for one: a client held to a fraction of a core by others on it is at ~1.0),
  or whose event loop woke ``LAG_LIMIT_MS`` late at p99 (it sent that late against its
  schedule), is named with its numbers, and the sentence suggests more
  clients (or cores for them, when they shared).
- ``kv-capacity``: the KV cache ran out: preemptions (vLLM V1 preempts a running request
  only when it cannot allocate a KV block), or peak usage at ``KV_FULL`` or more while
  requests waited.
- ``scheduler-queue``: requests waited at the server (``num_requests_waiting`` peaked at
  ``WAITING_SHARE`` of the client's concurrency or more) while it ran fewer than the
  client had in flight and the KV cache had room: a batch limit (``max_num_seqs``,
  ``max_num_batched_tokens``) held them, not memory.
- ``compute-prefill``: the GPU busy (``gpu_util`` at ``GPU_BUSY`` or more) and the first
  token taking ``PREFILL_SHARE`` of each request's time or more.
- ``memory-bandwidth-decode (estimate)``: the GPU busy and decode taking most of each
  request's time, or a decode roofline fraction (``runners.roofline``, itself an
  estimate) of ``ROOFLINE_BOUND`` or more, which the sentence quotes when the caller
  computed it (the portal does, for known GPUs).
- ``unknown``: the evidence is missing: a CPU run has no GPU utilisation, an HF baseline
  or an endpoint without ``/metrics`` has no server gauges. The sentence says which.

The rules run in this order, and the first that fires names the cause: a failure; the
KV cache; a server queue held by a batch limit (a hard cap shows whatever else ran); the
client's own CPU; contention on the server's cores (it distorts everything after it);
the client as the server saw it; the GPU. Peaks are sampled at 10 Hz
(``runners.server_metrics``), so a queue shorter than 0.1 s can be missed: no rule fires
on a sample it did not see.

Never imports Django: the portal (points, pages, API, compare's ranking) and the CLI
(``servebench results``) use it, on the same keys a result document holds.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CAUSES = (
    "kv-capacity",
    "scheduler-queue",
    "compute-prefill",
    "memory-bandwidth-decode (estimate)",
    "cpu/scheduler",
    "client",
    "errors",
    "network",
    "unknown",
)

# vLLM allocates KV blocks until none is free; at 95% peak usage the next request or
# the next block of a running one waits for memory (a block is 16-128 tokens, so the
# last few percent are a handful of blocks).
KV_FULL = 0.95
# A queue worth naming: requests waiting at the server of at least this share of the
# client's concurrency (one request waiting for a scheduler step is normal at any load).
WAITING_SHARE = 0.25
# vLLM's client is a single asyncio thread: at 90% of a core over the requests' window
# it has no headroom left to send on time or read streams promptly.
CLIENT_SATURATED = 0.9
# A client whose CPU plus run-queue wait reached this share of a core wanted a whole
# core (busy, or ready and waiting for one): its sends and stream reads fell behind.
CLIENT_DEMAND = 0.9
# An event loop waking this late sends that late: a schedule the client did not keep.
LAG_LIMIT_MS = 50.0
# Achieved request rate below 80% of what the target allows (num_prompts over the
# sending time plus one mean request latency, the tail the client waits for).
RATE_SHORTFALL = 0.8
# The server ran on average under half the client's concurrency with nothing waiting:
# the client, not the server, kept requests from being in flight.
CLIENT_FILL = 0.5
# NVML utilisation (share of time a kernel ran): above 80% the GPU is the busy part;
# under 50% it waited for work.
GPU_BUSY = 0.8
GPU_IDLE = 0.5
# The first token took at least half of each request's end-to-end time: prefill dominates.
PREFILL_SHARE = 0.5
# A decode roofline fraction worth calling bandwidth-bound on its own (the estimate errs
# low: activations and prefill are not counted).
ROOFLINE_BOUND = 0.5

# The first cause of a failure that is the network's (aiohttp, requests, the OS).
_NETWORK = re.compile(
    r"connection (?:refused|reset|aborted)|ClientConnectorError|ServerDisconnectedError|"
    r"ClientOSError|ConnectTimeout|ReadTimeout|timed out|TimeoutError|"
    r"Name or service not known|Temporary failure in name resolution|No route to host|"
    r"Network is unreachable|Broken pipe|RemoteDisconnected",
    re.IGNORECASE,
)
_SERVED = ("vllm", "endpoint", "transformers-serve")


@dataclass(frozen=True)
class Bottleneck:
    """What limited a point: one of ``CAUSES`` and a sentence with its evidence."""

    cause: str
    sentence: str

    def as_dict(self) -> dict[str, str]:
        return {"cause": self.cause, "sentence": self.sentence}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 or x == 0 else f"{x:.1%}"


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def _requests(x: float) -> str:
    """'1 request', '7 requests'."""
    return f"{_n(x)} request" + ("" if x == 1 else "s")


def _first_line(text: str) -> str:
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= 240 else line[:237] + "..."


def _failed(m: Mapping[str, Any]) -> Bottleneck:
    error = str(m.get("error") or "")
    line = _first_line(error) or "no reason was recorded"
    if _NETWORK.search(error):
        return Bottleneck("network", f"The point failed on the network: {line}")
    return Bottleneck("errors", f"The point failed, so nothing else limited it: {line}")


def _expected_rate(rate: float, prompts: float, e2el_ms: float | None) -> float:
    """Requests/s a client sending ``prompts`` at ``rate`` can achieve at best: all of
    them over the sending time plus the last one's latency."""
    tail = (e2el_ms or 0.0) / 1000
    return prompts / (prompts / rate + tail)


def saturated(facts: Mapping[str, Any]) -> str | None:
    """Why one client was the limit (a clause quoting its numbers), or None."""
    cpu = _num(facts.get("cpu_per_wall"))
    wait = _num(facts.get("wait_per_wall")) or 0.0
    lag = _num(facts.get("send_lag_p99_ms"))
    if cpu is not None and cpu + wait >= CLIENT_DEMAND:
        said = f"used {cpu:.2f} CPU-seconds per second"
        if wait >= 0.05:
            said += f" and waited {wait:.2f} more for a core"
        if lag is not None:
            said += f" (send lag p99 {lag:.0f} ms)"
        return said
    if lag is not None and lag >= LAG_LIMIT_MS:
        return f"sent up to {lag:.0f} ms late against its schedule (p99 event-loop lag)"
    return None


def _more_clients(n: int, cond: Mapping[str, Any]) -> str:
    """What to do about a saturated load generator."""
    placement = str(cond.get("client_placement") or "")
    if "share" in placement:
        return f"give the runner more cores ({placement.split(':')[0]})"
    return f"run more load generators (workload.clients: {n + 1} or more)"


def client_limit(cond: Mapping[str, Any]) -> Bottleneck | None:
    """The ``client`` bottleneck from each client's own evidence, or None."""
    clients = [c for c in cond.get("clients") or [] if isinstance(c, Mapping)]
    limited = [(c, why) for c in clients if (why := saturated(c)) is not None]
    if not limited:
        return None
    first, why = limited[0]
    n = len(clients)
    who = "The load generator" if n == 1 else f"Client {first.get('index', '?')} of {n}"
    also = f" ({len(limited)} of {n} clients were)" if len(limited) > 1 else ""
    rate = ""
    target, sent = _num(first.get("target_rate")), _num(first.get("send_rate"))
    if target and sent is not None:
        rate = f"; it sent {sent:.2f} req/s of its {target:g} req/s target"
    return Bottleneck(
        "client",
        f"{who} was the limit{also}: it {why}{rate}, so the server saw less load than "
        f"asked; {_more_clients(n, cond)}.",
    )


def diagnose(
    m: Mapping[str, Any],
    *,
    roofline_fraction: float | None = None,
) -> Bottleneck:
    """What limited measurement ``m`` (``runners.result.Measurement`` as a dict: status,
    error, backend_kind, point, metrics, server_metrics, conditions, raw).

    ``roofline_fraction``: the decode roofline fraction of this point when the caller
    computed it (``runners.roofline.decode_roofline``; needs the GPU and the weights).
    """
    if m.get("status") != "succeeded":
        return _failed(m)
    point = m.get("point") or {}
    metrics = m.get("metrics") or {}
    server = m.get("server_metrics") or {}
    cond = m.get("conditions") or {}
    raw = m.get("raw") or {}
    kind = str(m.get("backend_kind") or "")
    concurrency = _num(point.get("max_concurrency")) or 0.0
    prompts = _num(point.get("num_prompts")) or 0.0
    in_flight = min(concurrency, prompts) if prompts else concurrency
    gpu_util = _num(metrics.get("gpu_util"))

    # 1. The KV cache ran out.
    preemptions = _num(server.get("preemptions"))
    kv = _num(server.get("kv_cache_usage_peak"))
    waiting = _num(server.get("num_requests_waiting_peak"))
    running_peak = _num(server.get("num_requests_running_peak"))
    running_mean = _num(server.get("num_requests_running_mean"))
    if preemptions:
        return Bottleneck(
            "kv-capacity",
            f"The KV cache ran out: {_n(preemptions)} preemptions"
            + (f", usage peaked at {_pct(kv)}" if kv is not None else "")
            + (f", up to {_requests(waiting)} waited" if waiting else "")
            + ".",
        )
    if kv is not None and kv >= KV_FULL and waiting:
        return Bottleneck(
            "kv-capacity",
            f"The KV cache was full: usage peaked at {_pct(kv)} while up to {_n(waiting)} "
            "requests waited for blocks (no preemptions).",
        )

    # 2. The server queued requests it could have held (a hard cap, not slowness).
    queued = (
        waiting is not None
        and waiting >= max(1.0, WAITING_SHARE * in_flight)
        and running_peak is not None
        and running_peak < in_flight
    )
    if queued and gpu_util is not None and gpu_util < GPU_IDLE:
        return Bottleneck(
            "cpu/scheduler",
            f"The GPU was busy only {_pct(gpu_util)} of the time while up to {_n(waiting)} "
            "requests waited: the CPU side (scheduler, tokenisation, server) did not feed it.",
        )
    if queued:
        assert waiting is not None and running_peak is not None
        return Bottleneck(
            "scheduler-queue",
            f"The scheduler ran at most {_requests(running_peak)} at once while up to "
            f"{_n(waiting)} waited, of the {_n(in_flight)} the client kept in flight, "
            + (f"with the KV cache at most {_pct(kv)} full" if kv is not None else "")
            + ": a batch limit (max_num_seqs, max_num_batched_tokens), not memory, held them.",
        )

    # 3. The load generator out of CPU (its own CPU time, whatever else ran).
    if (limited := client_limit(cond)) is not None:
        return limited
    client_cpu = _num(cond.get("client_cpu_per_wall"))
    if client_cpu is not None and client_cpu >= CLIENT_SATURATED:
        return Bottleneck(
            "client",
            f"The load generator was saturated: it used {client_cpu:.2f} CPU-seconds per "
            "second over the requests' window (one asyncio thread), so it could not send "
            "or read faster; " + _more_clients(1, cond) + ".",
        )

    # 4. Something else on the cores: the numbers are the machine's, not the server's.
    reasons = [r for r in cond.get("reasons") or [] if isinstance(r, str)]
    if cond.get("contended") and reasons:
        return Bottleneck(
            "cpu/scheduler",
            f"The server's cores were shared while it ran: {reasons[0]}.",
        )

    # 5. The load generator, from what the server saw.
    traffic = raw.get("traffic") if isinstance(raw.get("traffic"), Mapping) else {}
    lag = traffic.get("lag") if isinstance(traffic.get("lag"), Mapping) else {}
    if lag.get("kept_up") is False and _num(lag.get("p99_ms")) is not None:
        return Bottleneck(
            "client",
            f"The traffic client fell behind its schedule: p99 send lag {lag['p99_ms']:.1f} ms "
            f"is above {_num(lag.get('limit_ms')) or 0:g} ms ({lag.get('late_requests', '?')} "
            "requests late), so the server saw a lighter load than asked.",
        )
    rate = _num(point.get("request_rate"))
    achieved = _num(metrics.get("request_throughput"))
    if rate and achieved is not None and prompts and not waiting:
        expected = _expected_rate(rate, prompts, _num(metrics.get("mean_e2el_ms")))
        if achieved < RATE_SHORTFALL * expected:
            return Bottleneck(
                "client",
                f"The client achieved {achieved:.2f} req/s of the {rate:g} req/s target "
                f"({_pct(achieved / expected)} of what the target allows for "
                f"{_n(prompts)} prompts) while no request waited at the server.",
            )
    if (
        running_mean is not None
        and in_flight >= 2
        and not waiting
        and running_mean < CLIENT_FILL * in_flight
        and not rate
    ):
        return Bottleneck(
            "client",
            f"The server ran {running_mean:.1f} requests on average of the {_n(in_flight)} "
            "the client should have had in flight, and none waited: the client did not "
            "keep its requests in flight. Give it more cores or split the load "
            "(workload.clients: 2 or more).",
        )

    # 6. The GPU itself.
    ttft = _num(metrics.get("mean_ttft_ms"))
    e2el = _num(metrics.get("mean_e2el_ms"))
    share = ttft / e2el if ttft is not None and e2el else None
    bound = roofline_fraction is not None and roofline_fraction >= ROOFLINE_BOUND
    if gpu_util is None and not bound:
        if kind not in _SERVED:
            why = "an in-process baseline has no server gauges and no GPU utilisation"
        elif not server or not server.get("samples"):
            why = "the server reported no /metrics and no GPU utilisation was measured"
        else:
            why = "no GPU utilisation was measured (a CPU run, or no NVML)"
        seen = []
        if running_peak is not None and in_flight:
            seen.append(f"it ran up to {_n(running_peak)} of {_n(in_flight)} requests")
        seen.append(f"up to {_n(waiting)} waited" if waiting else "none waited")
        if kv is not None:
            seen.append(f"the KV cache peaked at {_pct(kv)}")
        said = f"; {', '.join(seen)}, no preemptions" if server.get("samples") else ""
        return Bottleneck("unknown", f"Unknown: {why}{said}.")
    if gpu_util is not None and gpu_util < GPU_IDLE:
        return Bottleneck(
            "client",
            f"The GPU was busy only {_pct(gpu_util)} of the time and no request waited: the "
            f"offered load (concurrency {_n(concurrency)}"
            + (f", {rate:g} req/s" if rate else "")
            + ") did not fill it.",
        )
    busy = gpu_util is not None and gpu_util >= GPU_BUSY
    if busy and share is not None and share >= PREFILL_SHARE:
        assert gpu_util is not None
        return Bottleneck(
            "compute-prefill",
            f"Prefill: the GPU was busy {_pct(gpu_util)} of the time and the first token "
            f"took {_pct(share)} of each request's time (prompt {point.get('input_len')} "
            "tokens).",
        )
    if busy or bound:
        said = [f"the GPU was busy {_pct(gpu_util)} of the time"] if gpu_util is not None else []
        if share is not None:
            said.append(f"decode took {_pct(1 - share)} of each request's time")
        if roofline_fraction is not None:
            said.append(
                f"decode reached about {_pct(roofline_fraction)} of the memory-bandwidth "
                "roofline (an estimate)"
            )
        return Bottleneck(
            "memory-bandwidth-decode (estimate)",
            "Decode, bound by memory bandwidth (an estimate): " + "; ".join(said) + ".",
        )
    assert gpu_util is not None
    return Bottleneck(
        "unknown",
        f"Unknown: the GPU was busy {_pct(gpu_util)} of the time (neither idle nor "
        "saturated), with no queue, no preemptions and KV room.",
    )


def combine(found: Iterable[Bottleneck]) -> Bottleneck | None:
    """One point's bottleneck over its repeats: the most common cause (first seen on a
    tie), its first sentence, and how many repeats agreed when they did not all."""
    items = list(found)
    if not items:
        return None
    counts = Counter(b.cause for b in items)
    cause = max(counts, key=lambda c: (counts[c], -[b.cause for b in items].index(c)))
    first = next(b for b in items if b.cause == cause)
    if counts[cause] == len(items):
        return first
    return Bottleneck(cause, f"{first.sentence} ({counts[cause]} of {len(items)} repeats)")
