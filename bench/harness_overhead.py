"""Harness overhead: the seed's manual loop vs ``python -m runners run``, same sweep.

(a) manual, as the seed tutorial does it: start one vLLM server, wait for /health, run
    vLLM's bench client once per concurrency, stop the server;
(b) the runner: ``python -m runners run spec.json`` for the same model, flags and sweep
    (vLLM only), which adds environment capture, /metrics sampling, reporting and the
    result document.

Prints the wall time of each, their ratio (target: runner <= 1.10x manual) and output
throughput per point side by side (target: within run-to-run noise). A benchmark, not a
test: nothing here asserts on time.

    python bench/harness_overhead.py [--rounds 2] [--num-prompts 32]

Runs on the tiny CPU model by default (``--model DIR`` for another); ``--rounds N``
alternates the order (manual first, then runner first, ...) so a warm compile cache
does not favour one side. Per point it also prints how much of the cores other processes
used while the bench client ran (``runners.conditions``: the runner records it in each
measurement, and the manual loop is watched the same way from here): on a shared
machine, read the throughput ratios with it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runners import conditions  # noqa: E402
from runners.tiny_model import ensure  # noqa: E402

CONCURRENCY = (1, 4, 16)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


Side = tuple[float, float, dict[int, float], dict[int, float]]  # wall, startup, tok/s, others


def manual(model: str, args: argparse.Namespace, workdir: Path) -> Side:
    """The seed's loop, written the way a person would: no runners code involved."""
    port = _port()
    t0 = time.monotonic()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16",
        "--max-model-len", "2048", "--no-enable-prefix-caching",
    ]  # fmt: skip
    with open(workdir / "manual-server.log", "wb") as log:
        server = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while True:
            if server.poll() is not None:
                raise SystemExit(f"manual server died; see {workdir / 'manual-server.log'}")
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        startup = time.monotonic() - t0
        throughput, others = {}, {}
        for c in CONCURRENCY:
            name = f"manual-c{c}.json"
            client = (
                "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
                "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
                "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
            )
            argv = [
                sys.executable, "-c", client, "--backend", "vllm", "--model", model,
                "--base-url", f"http://127.0.0.1:{port}", "--dataset-name", "random",
                "--random-input-len", str(args.input_len),
                "--random-output-len", str(args.output_len),
                "--num-prompts", str(args.num_prompts), "--max-concurrency", str(c),
                "--num-warmups", "2", "--temperature", "0", "--ignore-eos",
                "--percentile-metrics", "ttft,tpot,itl,e2el",
                "--metric-percentiles", "50,90,99", "--disable-tqdm",
                "--save-result", "--result-dir", str(workdir), "--result-filename", name,
            ]  # fmt: skip
            with (
                open(workdir / f"manual-c{c}.log", "wb") as log,
                conditions.Watch(conditions.own_cores()) as watch,
            ):
                subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True)
            throughput[c] = json.loads((workdir / name).read_text())["output_throughput"]
            others[c] = watch.result().get("others_share", 0.0)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait()
    return time.monotonic() - t0, startup, throughput, others


def runner(model: str, args: argparse.Namespace, workdir: Path) -> Side:
    spec = {
        "name": "harness overhead",
        "model": {"id": model, "max_model_len": 2048},
        "workload": {
            "input_len": args.input_len,
            "output_len": args.output_len,
            "num_prompts": args.num_prompts,
            "num_warmups": 2,
        },
        "sweeps": [{"name": "c", "axis": "max_concurrency", "values": list(CONCURRENCY)}],
        "backends": [{"kind": "vllm"}],
        "resources": {"gpu_count": 0},
    }
    (workdir / "spec.json").write_text(json.dumps(spec))
    out = workdir / "result.json"
    argv = [
        sys.executable, "-m", "runners", "run", str(workdir / "spec.json"), "--quiet",
        "--out", str(out), "--workdir", str(workdir / "runner"),
    ]  # fmt: skip
    t0 = time.monotonic()
    subprocess.run(argv, cwd=REPO, check=True)
    wall = time.monotonic() - t0
    doc = json.loads(out.read_text())
    throughput = {
        int(m["point"]["max_concurrency"]): m["metrics"]["output_throughput"]
        for m in doc["measurements"]
    }
    others = {
        int(m["point"]["max_concurrency"]): m["conditions"].get("others_share", 0.0)
        for m in doc["measurements"]
    }
    return wall, doc["timings"]["server_startup_s.vllm"], throughput, others


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model dir or hub id (default: the tiny CPU model)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = args.model or str(ensure())

    results: dict[str, list[Side]] = {"manual": [], "runner": []}
    for r in range(args.rounds):
        order = ("manual", "runner") if r % 2 == 0 else ("runner", "manual")
        for side in order:
            workdir = Path(tempfile.mkdtemp(prefix=f"servebench-overhead-{side}-"))
            fn = manual if side == "manual" else runner
            results[side].append(fn(model, args, workdir))
            wall, others = results[side][-1][0], results[side][-1][3]
            print(
                f"round {r + 1}: {side} done in {wall:.1f} s; other processes' share of the "
                f"cores per point: {', '.join(f'{x:.0%}' for x in others.values())}; "
                f"load {conditions.load_avg()}",
                file=sys.stderr,
                flush=True,
            )

    def med(side: str, i: int) -> float:
        return statistics.median(x[i] for x in results[side])

    def tput(side: str, c: int) -> float:
        return statistics.median(x[2][c] for x in results[side])

    print(
        f"\nharness overhead: {Path(model).name}, random {args.input_len} in / "
        f"{args.output_len} out, {args.num_prompts} prompts, concurrency "
        f"{'/'.join(map(str, CONCURRENCY))}, {args.rounds} round(s), {os.cpu_count()} CPUs\n"
    )
    print(f"{'':24}{'wall s':>10}{'server start s':>17}")
    for side, label in (("manual", "manual loop"), ("runner", "python -m runners run")):
        print(f"{label:24}{med(side, 0):>10.1f}{med(side, 1):>17.1f}")
    ratio = med("runner", 0) / med("manual", 0)
    print(f"{'ratio runner/manual':24}{ratio:>10.3f}   (target <= 1.10)\n")
    print(
        f"{'concurrency':>12}{'manual tok/s':>15}{'runner tok/s':>15}{'runner/manual':>16}"
        "   other processes' share of the cores (manual | runner, per round)"
    )
    for c in CONCURRENCY:
        m, r = tput("manual", c), tput("runner", c)
        shares = " | ".join(
            " ".join(f"{x[3][c]:.0%}" for x in results[side]) for side in ("manual", "runner")
        )
        print(f"{c:>12}{m:>15.1f}{r:>15.1f}{r / m:>16.3f}   {shares}")


if __name__ == "__main__":
    main()
