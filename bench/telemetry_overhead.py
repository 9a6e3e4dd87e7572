"""What sampling a point costs (issue 15): /metrics ten times a second, NVML where there is
a GPU, against the same point without the sampler.

1. Per scrape, on an idle server: the API server's CPU time for the full ``/metrics``
   exposition and for the filtered one the sampler asks for (``/metrics/?name[]=...``),
   and the sampler's own CPU time per scrape (``runners.server_metrics``).
2. ``--rounds`` pairs of the same point, alternating (with the sampler first, then
   without, ...): output tok/s, the API server's CPU time, and with the sampler its
   thread's CPU time as a share of the point's (``telemetry.sampler``), and how much of
   the cores other processes took (``runners.conditions``): on a shared machine, read
   the throughput ratio with it.

    python bench/telemetry_overhead.py [--rounds 4] [--num-prompts 96] [--concurrency 8]

A benchmark, not a test: nothing here asserts on time. Runs on the tiny CPU model by
default (``--model DIR`` for another).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runners import conditions as cond  # noqa: E402
from runners import procs  # noqa: E402
from runners import telemetry as tm  # noqa: E402
from runners.server_metrics import FILTER, PointWatcher  # noqa: E402
from runners.spec import parse_spec  # noqa: E402
from runners.tiny_model import ensure  # noqa: E402
from runners.vllm_bench import bench_flags, split_result  # noqa: E402
from runners.vllm_server import VLLMServer  # noqa: E402


def scrape_cost(base_url: str, api: psutil.Process, filtered: bool, n: int = 200) -> float:
    """The API server's CPU ms per scrape."""
    session = requests.Session()
    before = sum(api.cpu_times()[:2])
    for _ in range(n):
        if filtered:
            session.get(base_url + "/metrics/", params=FILTER, timeout=5)
        else:
            session.get(base_url + "/metrics", timeout=5)
    return (sum(api.cpu_times()[:2]) - before) / n * 1000


def one_point(server: VLLMServer, spec: Any, api: psutil.Process, sample: bool, workdir: Path):
    point = spec.points()[0]
    result = workdir / f"point-{time.monotonic_ns()}.json"
    flags = bench_flags(spec, point, server.base_url, result)
    argv = [sys.executable, "-m", "runners.bench_client", *flags]
    cpu0 = sum(api.cpu_times()[:2])
    watcher = PointWatcher(server.base_url) if sample else None
    if watcher is not None:
        watcher.__enter__()
    try:
        with cond.Watch(cond.own_cores()) as watch:
            procs.run(argv, workdir / "client.log", env=procs.python_env())
    finally:
        if watcher is not None:
            watcher.__exit__(None, None, None)
    api_cpu = sum(api.cpu_times()[:2]) - cpu0
    metrics, _, detail = split_result(json.loads(result.read_text()))
    conditions = watch.result()
    out = {
        "tok_s": metrics["output_throughput"],
        "api_cpu_s": api_cpu,
        "others": conditions.get("others_share") or 0.0,
    }
    if watcher is not None:
        telemetry = watcher.telemetry(detail)
        tm.sampler_share(telemetry, conditions.get("process_cpu_s"))
        window = telemetry.get("window") or [0, 0]
        inside = [t for t in telemetry["server"]["t"] if window[0] <= t <= window[1]]
        out |= {
            "share": telemetry["sampler"].get("share_of_point_cpu") or 0.0,
            "scrapes": telemetry["sampler"]["scrapes"],
            "in_window": len(inside),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--num-prompts", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    model = args.model or str(ensure())
    spec = parse_spec(
        {
            "model": {"id": model, "max_model_len": 512},
            "workload": {
                "input_len": 128,
                "output_len": 32,
                "num_prompts": args.num_prompts,
                "num_warmups": 1,
                "ignore_eos": True,
            },
            "sweeps": [{"name": "c", "axis": "max_concurrency", "values": [args.concurrency]}],
            "backends": [{"kind": "vllm"}],
        }
    )
    workdir = Path(tempfile.mkdtemp(prefix="servebench-telemetry-bench-"))
    with VLLMServer(spec, spec.vllm_backends[0], workdir / "server.log") as server:
        api = psutil.Process(server.pid)
        full, filtered = (scrape_cost(server.base_url, api, f) for f in (False, True))
        print(f"API server CPU per scrape: full {full:.2f} ms, filtered {filtered:.2f} ms")
        rows: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for i in range(args.rounds):
            for sample in (True, False) if i % 2 == 0 else (False, True):
                rows[sample].append(one_point(server, spec, api, sample, workdir))
                r = rows[sample][-1]
                print(
                    f"round {i + 1} {'with   ' if sample else 'without'}: "
                    f"{r['tok_s']:7.1f} tok/s, API server {r['api_cpu_s']:.2f} s CPU, "
                    f"others {r['others']:.0%} of the cores"
                    + (
                        f", sampler {r['share']:.2%} of the point's CPU, "
                        f"{r['in_window']} samples in the requests' window"
                        if sample
                        else ""
                    )
                )
    with_, without = (statistics.median(r["tok_s"] for r in rows[s]) for s in (True, False))
    print(
        f"median output tok/s: with {with_:.1f}, without {without:.1f} "
        f"(ratio {with_ / without:.3f}); median others' share "
        f"{statistics.median(r['others'] for r in rows[True] + rows[False]):.0%}"
    )


if __name__ == "__main__":
    main()
