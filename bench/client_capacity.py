"""How many requests per second one bench client process sustains, and 1 vs 3 clients.

Sizing ``workload.clients`` needs the client's own ceiling, which a real server hides
(a vLLM server on the tiny CPU model answers ~30 req/s; the client is far from its limit
there). So this bench points vLLM's real bench client (``runners.bench_client``, through
``runners.multiclient``: the same split, barrier and exact merge as a point with
``workload.clients``) at a trivial local OpenAI-compatible stub that answers every
streamed completion at once (``--stub``: aiohttp, ``output_len`` chunks of one token
each plus the usage chunk, written in one piece; ``--stub-procs`` processes share the
port). The stub is this bench's instrument, never a stand-in in tests.

It prints, for 1 client and for ``--clients`` clients (3 by default): the merged request
and output token throughput, each client's CPU per wall, run-queue wait per wall and
p99 send lag, the start skew, and the ratio of the throughputs. With one client on a core
and the stub on other cores, the 1-client request rate is that client's ceiling; on a
shared machine, its CPU per request (CPU per wall over the rate: what else ran does not
change it) gives the rate it sustains on a whole core, the number the docs quote. A
benchmark, not a test: nothing asserts on time. By default the stub writes each answer in
one piece, so the client reads its chunks together (an upper bound); ``--gap-ms 1``
streams one chunk per millisecond, one read each, as a real server's arrive.

    python bench/client_capacity.py [--clients 3] [--num-prompts 4000] [--output-len 16]
                                    [--gap-ms 0]

Pin it the way you size: the stub takes the first ``--stub-procs`` owned cores, the
clients one core each from the last (``runners.multiclient.placement``); with fewer cores
than processes they share, and the numbers say so (``others``, wait per wall).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runners import conditions, procs  # noqa: E402
from runners import multiclient as mc  # noqa: E402
from runners.bench_client import REPORT_ENV  # noqa: E402
from runners.spec import parse_spec  # noqa: E402
from runners.tiny_model import ensure  # noqa: E402
from runners.vllm_bench import bench_flags  # noqa: E402


def stub(port: int, gap_ms: float) -> None:
    """An OpenAI-compatible completions server that answers at once, or one chunk every
    ``gap_ms`` as a real server streams (this bench only)."""
    import asyncio

    from aiohttp import web

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        prompt = body.get("prompt")
        prompt_len = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        chunk = 'data: {"id":"s","object":"text_completion","choices":[{"index":0,"text":"a"}]}'
        usage = {"prompt_tokens": prompt_len, "completion_tokens": n}
        last = json.dumps({"id": "s", "choices": [], "usage": usage})
        parts = [*([chunk] * n), f"data: {last}", "data: [DONE]"]
        if not gap_ms:
            text = "\n\n".join([*parts, ""])
            return web.Response(text=text, content_type="text/event-stream")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for part in parts:
            await response.write(f"{part}\n\n".encode())
            await asyncio.sleep(gap_ms / 1000)
        await response.write_eof()
        return response

    async def empty(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/metrics", empty)
    app.router.add_get("/health", empty)
    web.run_app(app, host="127.0.0.1", port=port, reuse_port=True, print=None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the stub server did not listen on port {port} in {timeout_s:.0f} s")


def measure(spec, n: int, cores: list[int], base_url: str, workdir: Path) -> dict:
    """One point of ``n`` clients through runners.multiclient; the merge and evidence."""
    point = spec.points()[0]
    placed, how = mc.placement(cores, n)
    clients = []
    for i, (own_spec, own_point) in enumerate(mc.split(spec, point, n)):
        result = workdir / f"n{n}.c{i}.json"
        flags = bench_flags(own_spec, own_point, base_url, result)
        argv = [sys.executable, "-m", "runners.bench_client", *flags]
        report, log = workdir / f"n{n}.c{i}.fields.json", workdir / f"n{n}.c{i}.log"
        clients.append(mc.Client(i, argv, result, report, log, placed[i], placement=how))
    env = procs.python_env()
    env[REPORT_ENV] = str(workdir / "unused.json")
    merged_path, report_path = workdir / f"n{n}.json", workdir / f"n{n}.fields.json"
    code, bad, evidence = mc.measure(
        clients, env, workdir / f"n{n}.barrier", merged_path, report_path, None, None
    )
    if code != 0:
        raise SystemExit(f"{n} clients failed (code {code}): see {bad}")
    merged = json.loads(merged_path.read_text())
    return {"merged": merged, "evidence": evidence, "placement": how}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stub", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=96)
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--stub-procs", type=int, default=0, help="default: owned cores / 4")
    parser.add_argument(
        "--gap-ms", type=float, default=0.0, help="stream one chunk every GAP ms (0: at once)"
    )
    args = parser.parse_args()
    if args.stub:
        stub(args.stub, args.gap_ms)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    owned = list(conditions.own_cores().ids)
    n_stub = args.stub_procs or max(1, len(owned) // 4)
    stub_cores, client_cores = owned[:n_stub], owned[n_stub:] or owned
    port = free_port()
    servers = [
        subprocess.Popen(
            [sys.executable, __file__, "--stub", str(port), "--gap-ms", str(args.gap_ms)],
            preexec_fn=lambda: os.sched_setaffinity(0, stub_cores),
        )
        for _ in range(n_stub)
    ]
    try:
        wait_up(port)
        model = str(ensure())
        spec = parse_spec(
            {
                "model": {"id": model, "max_model_len": 2048},
                "workload": {
                    "input_len": args.input_len,
                    "output_len": args.output_len,
                    "num_prompts": args.num_prompts,
                    "max_concurrency": args.concurrency,
                    "num_warmups": 0,
                },
                "backends": [{"kind": "vllm"}],
            }
        )
        workdir = Path(tempfile.mkdtemp(prefix="servebench-client-capacity-"))
        print(
            f"stub: {n_stub} process(es) on cores {conditions.format_cpu_list(stub_cores)}; "
            f"clients on {conditions.format_cpu_list(client_cores)}; {args.num_prompts} "
            f"prompts, concurrency {args.concurrency}, {args.output_len} tokens each"
        )
        rates: dict[int, float] = {}
        ceilings: dict[int, list[float]] = {}
        for n in (1, args.clients):
            got = measure(spec, n, client_cores, f"http://127.0.0.1:{port}", workdir)
            m = got["merged"]
            rates[n] = m["request_throughput"]
            print(
                f"\n{n} client(s): {m['request_throughput']:.0f} req/s, "
                f"{m['output_throughput']:.0f} output tok/s over {m['duration']:.2f} s "
                f"({m['completed']} completed, {m['failed']} failed); {got['placement']}; "
                f"start skew {m.get('skew') or '-'}"
            )
            for c in got["evidence"]:
                rate, cpu = c.get("achieved_rate") or 0.0, c.get("cpu_per_wall") or 0.0
                # CPU per request does not depend on what else ran: the sizing number.
                per_core = f", {rate / cpu:.0f} req/s per whole core" if cpu else ""
                cpu_ms = f"{cpu / rate * 1000:.3f} CPU-ms per request" if rate else "-"
                ceilings.setdefault(n, []).append(rate / cpu if cpu else 0.0)
                print(
                    f"  client {c['index']}: {rate:.0f} req/s, CPU/wall {cpu}, "
                    f"wait/wall {c.get('wait_per_wall', '?')}, "
                    f"send lag p99 {c.get('send_lag_p99_ms', '?')} ms; {cpu_ms}{per_core}"
                )
        one, many = rates[1], rates[args.clients]
        ceiling = ceilings[1][0]
        print(
            f"\none client measured {one:.0f} req/s here, and at its CPU per request "
            f"sustains about {ceiling:.0f} req/s ({ceiling * args.output_len:.0f} streamed "
            f"tokens/s) on a core of its own; {args.clients} clients / 1 client = "
            f"{many / one:.2f}x"
        )
    finally:
        for proc in servers:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
