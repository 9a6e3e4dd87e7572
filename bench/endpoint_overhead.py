"""Endpoint vs vLLM backend: one server, measured both ways, same points.

(a) ``kind: vllm``: the runner's own path (``runners.vllm_bench.measure_point`` with the
    server it started: ``--backend vllm``, prefix cache reset before the point);
(b) ``kind: endpoint``: the same server as a deployment the runner did not start
    (``runners.endpoint.Endpoint``: ``--backend openai``, the endpoint's probes).

Both go through vLLM's bench client with the same flags otherwise, so their numbers must
agree within run-to-run noise: an endpoint backend adds nothing to what it measures.
Prints output throughput and median TTFT/TPOT per side and their ratios; the order
alternates by round so a warm server does not favour one side. A benchmark, not a test:
nothing here asserts on time.

    python bench/endpoint_overhead.py [--rounds 2] [--num-prompts 32]

Runs on the tiny CPU model by default (``--model DIR`` for another). Read the ratios
with the "others" column: the share of the cores other processes used during the point
(``runners.conditions``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runners import conditions  # noqa: E402
from runners.endpoint import Endpoint  # noqa: E402
from runners.spec import parse_spec  # noqa: E402
from runners.tiny_model import ensure  # noqa: E402
from runners.vllm_bench import measure_point  # noqa: E402
from runners.vllm_server import VLLMServer  # noqa: E402

CONCURRENCY = (1, 4)
METRICS = (("output tok/s", "output_throughput"), ("TTFT ms", "median_ttft_ms"),
           ("TPOT ms", "median_tpot_ms"))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model dir or hub id (default: the tiny CPU model)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = args.model or str(ensure())
    workdir = Path(tempfile.mkdtemp(prefix="servebench-endpoint-overhead-"))

    spec = parse_spec(
        {
            "model": {"id": model, "max_model_len": 2048},
            "workload": {
                "input_len": args.input_len,
                "output_len": args.output_len,
                "num_prompts": args.num_prompts,
                "num_warmups": 2,
            },
            "sweeps": [{"name": "c", "axis": "max_concurrency", "values": list(CONCURRENCY)}],
            "backends": [{"kind": "vllm", "name": "vllm"}],
            "resources": {"gpu_count": 0},
        }
    )
    (backend,) = spec.vllm_backends
    results: dict[str, dict[int, list[dict]]] = {"vllm": {}, "endpoint": {}}
    with VLLMServer(spec, backend, workdir / "server.log") as server:
        as_endpoint = parse_spec(
            {
                **spec.model_dump(mode="json"),
                "backends": [{"kind": "endpoint", "name": "endpoint", "base_url": server.base_url}],
            }
        )
        (endpoint,) = as_endpoint.endpoint_backends
        target = Endpoint(as_endpoint, endpoint, None, workdir / "endpoint.log")
        sides = {"vllm": (server, spec, backend), "endpoint": (target, as_endpoint, endpoint)}
        print(f"server up in {server.startup_s:.0f} s; work in {workdir}", file=sys.stderr)
        for r in range(args.rounds):
            order = ("vllm", "endpoint") if r % 2 == 0 else ("endpoint", "vllm")
            for point in spec.points():
                c = point.max_concurrency
                for side in order:
                    tgt, side_spec, side_backend = sides[side]
                    m = measure_point(tgt, side_spec, side_backend, point, r, workdir / side)
                    if m.status != "succeeded":
                        raise SystemExit(f"{side} c={c}: {m.error}")
                    row = {key: m.metrics[key] for _, key in METRICS}
                    row["others"] = (m.conditions or {}).get("others_share", 0.0)
                    results[side].setdefault(c, []).append(row)
                    print(
                        f"round {r + 1} c={c} {side}: {row['output_throughput']:.0f} tok/s, "
                        f"others {row['others']:.0%}, load {conditions.load_avg()}",
                        file=sys.stderr,
                        flush=True,
                    )

    print(
        f"\nendpoint vs vllm backend: {Path(model).name}, random {args.input_len} in / "
        f"{args.output_len} out, {args.num_prompts} prompts, {args.rounds} round(s), "
        f"medians, {os.cpu_count()} CPUs\n"
    )
    head = "".join(
        f"{label + ' vllm':>18}{label + ' endpoint':>22}{'ratio':>8}" for label, _ in METRICS
    )
    print(f"{'concurrency':>12}{head}{'others v|e':>14}")
    for c in CONCURRENCY:
        line = f"{c:>12}"
        for _, key in METRICS:
            v = statistics.median(x[key] for x in results["vllm"][c])
            e = statistics.median(x[key] for x in results["endpoint"][c])
            line += f"{v:>18.1f}{e:>22.1f}{e / v:>8.3f}"
        shares = " ".join(f"{x['others']:.0%}" for x in results["vllm"][c])
        shares += " | " + " ".join(f"{x['others']:.0%}" for x in results["endpoint"][c])
        print(f"{line}   {shares}")


if __name__ == "__main__":
    main()
