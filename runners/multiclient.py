"""Several load generators for one point, on this machine (``workload.clients``).

A point with ``clients: N`` runs N processes of ``runners.bench_client`` against the same
server. Each sends its share (``split``): the point's prompts and concurrency divided as
evenly as whole numbers allow (the first ones take the remainder), the request rate
divided by N (N Poisson arrival streams at rate r/N together are one at rate r), the
warm-ups divided the same way, and its own seed (``seed + index``: the same seed would
send every client the same random prompts, which a prefix cache would serve from the
first client's work).

**Cores.** When the runner owns at least N cores, client ``i`` is pinned to its own core,
counted from the last owned core down (the server's threads bind from the first); with
fewer cores they share them round-robin and ``placement`` says so. A single client keeps
today's placement (the runner's cores).

**Synchronized start.** The clients prepare on their own (tokenizer, dataset, test
request, warm-ups), then wait at a barrier (``runners.loadgen``): each writes
``ready-<i>`` into the point's barrier directory; when all N are ready this module
writes ``go`` with a start time ``START_DELAY_S`` ahead, and each client sends its first
timed request at that time. A client that exits before the start stops the others, and
the point fails with that client's log.

``runners.clientmerge`` merges their results exactly; ``runners.vllm_bench`` records the
merge, each client's own numbers and saturation, and the skew between their starts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners import clientmerge, procs
from runners.bench_client import REPORT_ENV
from runners.conditions import format_cpu_list
from runners.loadgen import BARRIER_ENV, INDEX_ENV
from runners.spec import Point, Spec

START_DELAY_S = 0.2  # from the last client ready to the first timed send: file polls fit
POLL_S = 0.02


def shares(total: int, n: int) -> list[int]:
    """``total`` split into ``n`` whole shares, the first ones taking the remainder."""
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


def with_clients(spec: Spec, clients: int | str) -> Spec:
    """``spec`` with ``workload.clients`` set (``auto`` replaced by the probe's count)."""
    return spec.model_copy(
        update={"workload": spec.workload.model_copy(update={"clients": clients})}
    )


def clients_for(spec: Spec, point: Point) -> int:
    """How many clients this point gets: the spec's, fewer when a point (an SLA search's)
    has fewer prompts or, without a rate, fewer requests in flight than that. ``auto``
    before the runner's probe resolved it (``runners.clientprobe``): one."""
    want = spec.workload.clients
    n = min(want if isinstance(want, int) else 1, point.num_prompts)
    if point.request_rate is None:
        n = min(n, point.max_concurrency)
    return max(n, 1)


def split(spec: Spec, point: Point, n: int) -> list[tuple[Spec, Point]]:
    """Each client's spec (its seed and warm-ups) and point (its share)."""
    w = spec.workload
    prompts = shares(point.num_prompts, n)
    concurrency = shares(point.max_concurrency, n)
    warmups = shares(w.num_warmups, n)
    rate = None if point.request_rate is None else point.request_rate / n
    out = []
    for i in range(n):
        workload = w.model_copy(update={"seed": w.seed + i, "num_warmups": warmups[i]})
        own = point.model_copy(
            update={
                "num_prompts": prompts[i],
                "max_concurrency": max(concurrency[i], 1),
                "request_rate": rate,
            }
        )
        out.append((spec.model_copy(update={"workload": workload}), own))
    return out


def placement(owned: Sequence[int], n: int) -> tuple[list[list[int]], str]:
    """Each client's cores and a sentence saying how they were placed."""
    ids = list(owned)
    if not ids:
        return [[] for _ in range(n)], "not pinned (no core list)"
    if len(ids) >= n:
        return [[ids[-1 - i]] for i in range(n)], f"each client on its own core of {len(ids)}"
    cores = [[ids[-1 - (i % len(ids))]] for i in range(n)]
    return cores, (
        f"{n} clients share {len(ids)} cores (round-robin, with the server's threads): "
        "give the runner more cores for one each"
    )


@dataclass
class Client:
    index: int
    argv: list[str]
    result: Path
    report: Path
    log: Path
    cores: list[int]
    placement: str = ""

    def read_report(self) -> dict[str, Any]:
        try:
            return json.loads(self.report.read_text()) if self.report.exists() else {}
        except (OSError, ValueError):
            return {}


def script(commands: Sequence[str]) -> str:
    """The clients' commands as one a person can run (together, without the barrier)."""
    return "\n".join([*(f"{c} &" for c in commands), "wait"])


def run(clients: Sequence[Client], env: dict[str, str], barrier: Path) -> tuple[int, Client | None]:
    """Start every client, release them together once all are ready, wait for all.
    Returns (0, None), or the first failing client's exit code and the client."""
    shutil.rmtree(barrier, ignore_errors=True)
    barrier.mkdir(parents=True)
    procs_: list[subprocess.Popen] = []
    try:
        for c in clients:
            for path in (c.result, c.report, c.log):
                path.unlink(missing_ok=True)
            child_env = env | {BARRIER_ENV: str(barrier), INDEX_ENV: str(c.index)}
            child_env[REPORT_ENV] = str(c.report)
            proc = procs.spawn(c.argv, c.log, child_env)
            procs_.append(proc)
            if c.cores and hasattr(os, "sched_setaffinity"):
                try:
                    os.sched_setaffinity(proc.pid, c.cores)
                except OSError:
                    c.cores = []  # gone already, or the core is not ours: recorded unpinned
        released = False
        while True:
            codes = [p.poll() for p in procs_]
            failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
            if failed is not None:
                return int(codes[failed] or 1), clients[failed]
            if all(code == 0 for code in codes):
                return 0, None
            if not released and all((barrier / f"ready-{c.index}").exists() for c in clients):
                go = barrier / "go.tmp"
                go.write_text(json.dumps({"start_at": time.time() + START_DELAY_S}))
                go.rename(barrier / "go")
                released = True
            if not released and any(code == 0 for code in codes):
                i = codes.index(0)
                return 1, clients[i]  # ended without reaching the barrier
            time.sleep(POLL_S)
    finally:
        for proc in procs_:
            if proc.poll() is None or procs.group_alive(proc.pid):
                procs.stop(proc, grace_s=5.0)
            procs.disarm(proc)


def merged_report(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The request adapter's facts over all clients (fields dropped and added, lengths
    checked, stream chunks), as ``runners.vllm_bench.request_facts`` reads one client's."""
    out: dict[str, Any] = {}
    for key in ("dropped_fields", "added_fields"):
        names = sorted({n for r in reports for n in r.get(key) or []})
        if names:
            out[key] = names
    if any("lengths" in r for r in reports):
        lengths: dict[str, Any] = {"checked": 0, "differing": 0, "examples": []}
        for r in reports:
            got = r.get("lengths") or {}
            lengths["checked"] += got.get("checked", 0)
            lengths["differing"] += got.get("differing", 0)
            lengths["examples"] = (lengths["examples"] + list(got.get("examples") or []))[:5]
        out["lengths"] = lengths
    if any("stream" in r for r in reports):
        keys = ("responses", "tokens", "chunks")
        out["stream"] = {k: sum((r.get("stream") or {}).get(k, 0) for r in reports) for k in keys}
    return out


def merge_clients(
    clients: Sequence[Client],
    result_path: Path,
    report_path: Path,
    slo: dict[str, float] | None,
    rate: float | None,
    where: Callable[[Client], str] | None = None,
    clock_offset: float | None = None,
) -> tuple[int, Path | None, list[dict[str, Any]]]:
    """Every client's result merged exactly into ``result_path`` (vLLM's format) and
    their adapter facts into ``report_path``; (0, None, each client's evidence), each
    saying where it ran (``where``: its cores by default). ``clock_offset``: clients on
    other hosts (``runners.clientmerge.merge``)."""
    reports = [c.read_report() for c in clients]
    share = rate / len(clients) if rate else None
    paths = [c.result for c in clients]
    # A point too large to hold spills its token gaps beside the result (runners.spilled).
    spill = result_path.with_name(result_path.stem + ".samples")
    merged, evidence = clientmerge.merge(paths, slo, reports, share, clock_offset, spill)
    for c, facts in zip(clients, evidence, strict=True):
        if where is not None:
            facts["cores"] = where(c)
        else:
            facts["cores"] = format_cpu_list(c.cores) if c.cores else "not pinned"
    result_path.write_text(json.dumps(merged))
    report_path.write_text(json.dumps(merged_report(reports)))
    return 0, None, evidence


def measure(
    clients: Sequence[Client],
    env: dict[str, str],
    barrier: Path,
    result_path: Path,
    report_path: Path,
    slo: dict[str, float] | None,
    rate: float | None,
) -> tuple[int, Path | None, list[dict[str, Any]]]:
    """Run the clients; when all succeeded, write their exact merge to ``result_path`` (in
    vLLM's format) and their adapter facts to ``report_path``. Returns the exit code, the
    log of the client that failed (None when none did) and each client's evidence."""
    code, bad = run(clients, env, barrier)
    if code != 0:
        return code, bad.log if bad is not None else None, []
    return merge_clients(clients, result_path, report_path, slo, rate)
