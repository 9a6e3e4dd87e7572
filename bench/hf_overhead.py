"""HF baseline parity: the runner's HF throughput against a plain ``generate()`` loop.

Sides, each a fresh process, run one after another in a new random order each round (so
drift, warm caches, neighbours and whatever the previous process left behind hit every
side alike; ``--seed`` makes the orders reproducible), all with the same model,
prompt length, output length, greedy decoding, KV cache, ``min_new_tokens ==
max_new_tokens``, one warm-up generate and the same number of prompts:

- ``plain``: a plain loop written as a person would (no ``runners`` code): load, warm up,
  time ``for prompt in prompts: model.generate(...)``, tokens / seconds;
- ``plain+stamps``: the same loop with a per-token timestamp streamer (what the runner
  does to get TTFT and ITL), to isolate what the instrumentation costs;
- ``runner``: ``python -m runners run spec.json --out result.json`` with an HF-only spec;
- ``portal``: the runner started exactly as the portal's local executor starts it: the
  argv of ``LocalExecutor.supervisor_argv`` (``supervise.py``, in PID and mount
  namespaces when ``unshare`` works here, ``--report URL``) and the environment of
  ``runner_environment`` (the portal's environment minus its secrets, plus a run token),
  reporting to an in-process stand-in for the ingestion API. Django's settings are loaded
  for that (no database is touched); Celery, the web server and PostgreSQL are not
  running, so this measures the path, not the load a running portal adds (the
  ``conditions`` of each point say when something else was running).

Prints, per round and as medians, output tok/s of every side and the paired ratios
``side / plain`` (target for ``runner`` and ``portal``: >= 0.95); the same over the
*clean* pairs only (rounds in which neither timed loop was contended: the runner's own
``conditions``, and for the plain loop the same ``runners.conditions.Watch`` run from
here around its timed loop); output tokens per CPU second of each timed loop (the work
per token, which contention changes far less than wall time); each loop's contention and
the host load. A benchmark, not a test: nothing here asserts on time.

    python bench/hf_overhead.py [--rounds 6] [--num-prompts 32] [--sides plain,runner,...]
    python bench/hf_overhead.py --cpus 1      # every side on core 1 (one thread)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runners import conditions  # noqa: E402
from runners.tiny_model import ensure  # noqa: E402

SIDES = ("plain", "plain+stamps", "runner", "portal")

# The plain loop: what a person writes to time generate(). Nothing from runners.
PLAIN = r"""
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, input_len, output_len, n, stamps = sys.argv[1:6]
input_len, output_len, n, stamps = int(input_len), int(output_len), int(n), stamps == "1"
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="bfloat16").eval()
vocab = min(len(tok), model.get_input_embeddings().num_embeddings)
allowed = torch.tensor([i for i in range(vocab) if i not in set(tok.all_special_ids)])
gen = torch.Generator().manual_seed(0)
prompts = allowed[torch.randint(0, len(allowed), (n + 1, input_len), generator=gen)]
kw = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
          use_cache=True, pad_token_id=tok.pad_token_id or 0)

class Stamps:
    def __init__(self):
        self.times, self.first = [], True
    def put(self, value):
        if self.first:
            self.first = False
        else:
            self.times.append(time.perf_counter())
    def end(self):
        pass

with torch.inference_mode():
    ids = prompts[0:1]
    model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    produced = 0
    print("begin", flush=True)  # (for the bench's own watch of the timed loop)
    sys.stdin.readline()
    c0, t0 = time.process_time(), time.perf_counter()
    for p in prompts[1:]:
        ids = p.unsqueeze(0)
        out = model.generate(ids, attention_mask=torch.ones_like(ids),
                             streamer=Stamps() if stamps else None, **kw)
        produced += out.shape[1] - ids.shape[1]
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
print("end", flush=True)
sys.stdin.readline()
print(json.dumps({"output_throughput": produced / seconds, "tokens_per_cpu_s": produced / cpu,
                  "threads": torch.get_num_threads()}))
"""


class _Ingest(BaseHTTPRequestHandler):
    """Accepts whatever the runner reports (the portal's ingestion API, minus storage)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"ok": True, "run_status": "running"}).encode()
        self.send_response(201 if self.path.endswith("/measurements") else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _spec(model: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "name": "hf overhead",
        "model": {"id": model, "max_model_len": 2048},
        "workload": {
            "input_len": args.input_len,
            "output_len": args.output_len,
            "num_prompts": args.num_prompts,
        },
        "backends": [{"kind": "hf-sequential", "num_prompts": args.num_prompts}],
        "resources": {"gpu_count": 0},
    }


def _hf_result(path: Path) -> tuple[float, dict[str, Any]]:
    """Output tok/s and the conditions of the timed loop (with its tokens per CPU second)."""
    doc = json.loads(path.read_text())
    m = doc["measurements"][0]
    if m["status"] != "succeeded":
        raise SystemExit(f"the runner's HF point failed: {m['error']}")
    cond = dict(m.get("conditions") or {})
    if cond.get("process_cpu_s"):
        cond["tokens_per_cpu_s"] = m["metrics"]["total_output_tokens"] / cond["process_cpu_s"]
    return m["metrics"]["output_throughput"], cond


class Portal:
    """The local executor's argv and environment, with a stand-in ingestion endpoint."""

    def __init__(self, root: Path) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Ingest)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        os.environ.update(
            {
                "DJANGO_SETTINGS_MODULE": "portal.settings",
                "DEBUG": "1",
                "SERVEBENCH_HOME": str(root / "home"),
                "SERVEBENCH_DATA_DIR": str(root / "data"),
                "SERVEBENCH_PUBLIC_URL": f"http://127.0.0.1:{self.server.server_port}",
                "SERVEBENCH_RUNNER_PYTHON": sys.executable,
            }
        )
        os.environ.setdefault("DATABASE_URL", "postgres://bench@127.0.0.1:1/unused")
        os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:1/0")
        import django

        django.setup()
        from portal.dispatch.executors import local

        self.local = local
        self.executor = local.LocalExecutor()
        self.count = 0

    def run(self, spec: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        self.count += 1
        run = SimpleNamespace(public_id=f"hf-overhead-{os.getpid()}-{self.count}", spec=spec)
        workdir = Path(self.executor.handle_for(run)["workdir"])
        workdir.mkdir(parents=True)
        (workdir / "spec.json").write_text(json.dumps(spec))
        argv = self.executor.supervisor_argv(run, workdir)
        env = self.local.runner_environment("sb_run_bench-token-not-checked")
        with open(workdir / "runner.log", "ab") as log:
            proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=log)
        try:
            code = proc.wait()
        except BaseException:
            proc.terminate()  # the supervisor stops the runner and its HF child
            proc.wait()
            raise
        if code != 0:
            raise SystemExit(f"the portal-path runner exited {code}; see {workdir}/runner.log")
        return _hf_result(workdir / "result.json")

    def close(self) -> None:
        self.server.shutdown()


def _plain(argv: list[str], cores: conditions.Cores) -> tuple[dict, dict]:
    """Run the plain loop, watching its timed loop from here as the runner watches its own
    (the loop waits for a line on stdin at its start and end, outside its timing)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    watch = conditions.Watch(cores, cpu_bound=True)
    lines = []
    for line in proc.stdout:
        if line.strip() == "begin":
            watch.__enter__()
        elif line.strip() == "end":
            watch.__exit__(None, None, None)
        else:
            lines.append(line)
            continue
        proc.stdin.write("\n")
        proc.stdin.flush()
    if proc.wait() != 0:
        raise SystemExit(f"the plain loop exited {proc.returncode}")
    return json.loads(lines[-1]), watch.result()


def measure(side: str, model: str, args: argparse.Namespace, portal: Portal | None) -> dict:
    """One side, one process; returns its throughput and the conditions it ran under."""
    work = Path(tempfile.mkdtemp(prefix=f"servebench-hf-overhead-{side.replace('+', '-')}-"))
    cores = conditions.own_cores()
    inner: dict[str, Any] = {}
    with conditions.Watch(cores) as watch:  # the whole process, as seen from here
        if side in ("plain", "plain+stamps"):
            argv = [sys.executable, "-c", PLAIN, model, str(args.input_len)]
            argv += [str(args.output_len), str(args.num_prompts), str(int(side != "plain"))]
            plain, inner = _plain(argv, cores)
            tput = plain["output_throughput"]
            inner |= {k: plain[k] for k in ("threads", "tokens_per_cpu_s")}
        elif side == "runner":
            (work / "spec.json").write_text(json.dumps(_spec(model, args)))
            argv = [sys.executable, "-m", "runners", "run", str(work / "spec.json"), "--quiet"]
            argv += ["--out", str(work / "result.json"), "--workdir", str(work / "work")]
            subprocess.run(argv, cwd=REPO, check=True)
            tput, inner = _hf_result(work / "result.json")
        else:
            assert portal is not None
            tput, inner = portal.run(_spec(model, args))
    seen = watch.result()
    return {"tput": tput, "outer": seen, "inner": inner}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model dir (default: the tiny CPU model)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--sides", default=",".join(SIDES), help=f"any of {', '.join(SIDES)}")
    parser.add_argument("--seed", type=int, default=0, help="of the order of sides per round")
    parser.add_argument(
        "--cpus",
        help="run every side on these cores (e.g. 1): pinned, threads sized to them; the "
        f"runners get it as ${conditions.CPUS_ENV}, as the portal's runner would",
    )
    args = parser.parse_args()
    sides = [s for s in args.sides.split(",") if s]
    if unknown := set(sides) - set(SIDES):
        parser.error(f"unknown sides: {', '.join(sorted(unknown))}")
    if "plain" not in sides:
        parser.error("the ratios need the plain side")
    if args.cpus:
        os.environ[conditions.CPUS_ENV] = args.cpus
        conditions.pin(conditions.own_cores())  # every side inherits the affinity
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model = args.model or str(ensure())
    root = Path(tempfile.mkdtemp(prefix="servebench-hf-overhead-"))
    portal = Portal(root) if "portal" in sides else None

    results: dict[str, list[dict]] = {s: [] for s in sides}
    order = random.Random(args.seed)
    try:
        for r in range(args.rounds):
            for side in order.sample(sides, len(sides)):
                res = measure(side, model, args, portal)
                results[side].append(res)
                print(
                    f"round {r + 1}: {side:<13} {res['tput']:7.1f} tok/s  "
                    f"others {res['inner'].get('others_share', 0):.0%} of the cores  "
                    f"load {res['outer']['load_avg']['end'][0]:.2f}"
                    + ("  CONTENDED" if res["inner"].get("contended") else ""),
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if portal is not None:
            portal.close()

    cores = conditions.own_cores()
    print(
        f"\nHF overhead: {Path(model).name}, {args.input_len} in / {args.output_len} out, "
        f"{args.num_prompts} prompts, greedy, min_new_tokens = max_new_tokens, "
        f"{args.rounds} round(s) in shuffled order; {cores.summary()}\n"
    )

    def clean(x: dict) -> bool:
        """Nothing competed for the cores during the timed loop (the runner's verdict)."""
        return x["inner"].get("contended") is False

    print(
        f"{'side':<14}{'tok/s median':>13}{'/ plain':>9}{'clean pairs':>13}"
        f"{'/ plain, clean':>16}   per round (tok/s, * = contended)"
    )
    for side in sides:
        pairs = list(zip(results[side], results["plain"], strict=True))
        ratios = [x["tput"] / p["tput"] for x, p in pairs]
        clean_ratios = [x["tput"] / p["tput"] for x, p in pairs if clean(x) and clean(p)]
        clean_text = f"{statistics.median(clean_ratios):.3f}" if clean_ratios else "-"
        per_round = " ".join(f"{x['tput']:.0f}{'' if clean(x) else '*'}" for x in results[side])
        target = "  (target >= 0.95)" if side in ("runner", "portal") else ""
        print(
            f"{side:<14}{statistics.median(x['tput'] for x in results[side]):>13.1f}"
            f"{statistics.median(ratios):>9.3f}{len(clean_ratios):>13}{clean_text:>16}   "
            f"{per_round}{target}"
        )
    print(
        "\n/ plain: the median of the per-round ratios side / plain; clean pairs: rounds in "
        "which neither side's timed loop was contended (runners.conditions: other processes "
        f"took under {conditions.CONTENDED_SHARE:.0%} of the cores, no steal, and the loop "
        "had its CPU); the plain loop is watched from this process the same way."
    )
    print(
        "\nOutput tokens per CPU second of the timed loop (the work each side does per token, "
        "which other processes' use of the cores does not change much; with OpenMP threads "
        "that spin while they wait it includes the spinning):"
    )
    for side in sides:
        per_cpu = [x["inner"].get("tokens_per_cpu_s") for x in results[side]]
        pairs = [
            (a, p["inner"].get("tokens_per_cpu_s"))
            for a, p in zip(per_cpu, results["plain"], strict=True)
        ]
        ratios = [a / b for a, b in pairs if a and b]
        if ratios:
            print(
                f"  {side:<13} {statistics.median(a for a in per_cpu if a):8.1f} tok/CPU-s, "
                f"/ plain {statistics.median(ratios):.3f}"
            )
    print("\nOther processes' share of the cores during each timed loop, per round:")
    for side in sides:
        shares = ", ".join(f"{x['inner'].get('others_share', 0):.0%}" for x in results[side])
        flags = sum(bool(x["inner"].get("contended")) for x in results[side])
        threads = sorted({x["inner"].get("threads") for x in results[side]} - {None})
        print(
            f"  {side:<13} threads {'/'.join(map(str, threads)) or '?'}: {shares} "
            f"(contended: {flags} of {len(results[side])})"
        )
    loads = [x["outer"]["load_avg"]["end"][0] for side in sides for x in results[side]]
    print(f"host load average (1 min) during the run: {min(loads):.2f} to {max(loads):.2f}")


if __name__ == "__main__":
    main()
