"""Verdict A/A: how often does the verdict engine cry wolf, and how often does it catch a
real slowdown, for each source of run-to-run noise?

Real measurements of the tiny model: one vLLM server at a time (``--servers`` of them,
one after the other, so some pairs straddle a server restart), vLLM's own bench client
run in this process (the modules behind ``vllm bench serve``) ``--measurements`` times on
the same point, back to back. Every measurement is one run's worth of one point (its
reported metrics and per-request arrays). Then, with ``servebench.verdict`` at its
defaults (5% threshold, 95% intervals) on the CI gate's default metrics:

- **A/A pairs** (the same spec measured twice; any ``worse`` or ``better`` is a false
  alarm), judged with each noise source the engine knows:
  - one repeat, no history (and, for contrast, the request-level interval deciding
    alone, which is what the engine did before: an A/A pair gave "9 regressions");
  - one repeat with the series' history (the earlier measurements, newest
    ``LOOKBACK``, at least ``MIN_HISTORY``);
  - repeats (consecutive measurements grouped 2 and 3 to a run, disjoint pairs of runs);
- **detection**: the same pairs with each ``--slowdown`` injected into the candidate
  (latencies and their per-request arrays times 1 + s, throughput divided by it): the
  share judged ``worse``.

Printed: the rates per noise source and per metric. Target: false alarms at most the
stated 5% (per verdict). Measurements on one server back to back share its warm state,
so they understate the run-to-run noise of separate runs: the rates are a best case for
detection and a fair test of false alarms only where noise was measured at all.

    python bench/verdict_aa.py [--measurements 96] [--servers 3] [--slowdown 0.2 0.5]
    python bench/verdict_aa.py --save m.json   # keep the measurements; --load m.json reuses

A benchmark, not a test: it prints, it asserts nothing. 4 to 11 minutes on 2 busy CPU cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from runners import spec as rs  # noqa: E402
from runners.tiny_model import ensure  # noqa: E402
from servebench import verdict as v  # noqa: E402

METRICS = v.DEFAULT_METRICS
WARNING = (v.WORSE, v.BETTER)


# --------------------------------------------------------------------------- measuring


def the_spec(model: str, args: argparse.Namespace) -> rs.Spec:
    return rs.Spec(
        name="verdict A/A",
        model=rs.ModelSpec(id=model, dtype="bfloat16", max_model_len=2048),
        workload=rs.Workload(
            input_len=128,
            output_len=32,
            num_prompts=args.num_prompts,
            num_warmups=2,
            max_concurrency=args.concurrency,
        ),
        backends=[rs.VLLMBackend()],
        resources=rs.Resources(gpu_count=0),
    )


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``args.measurements`` results of one point, spread over ``args.servers`` servers."""
    spec = the_spec(str(ensure()), args)
    point = spec.points()[0]
    with tempfile.TemporaryDirectory(prefix="verdict-aa-") as tmp:
        return _measure(spec, point, Path(tmp), args)


def _measure(
    spec: rs.Spec, point: rs.Point, workdir: Path, args: argparse.Namespace
) -> list[dict[str, Any]]:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from runners.vllm_bench import bench_flags, client_failure, split_result
    from runners.vllm_server import VLLMServer

    out: list[dict[str, Any]] = []
    per_server = [args.measurements // args.servers] * args.servers
    per_server[-1] += args.measurements - sum(per_server)
    for s, count in enumerate(per_server):
        t0 = time.monotonic()
        with VLLMServer(spec, spec.vllm_backends[0], workdir / f"server-{s}.log") as server:
            print(f"server {s + 1}/{args.servers} ready in {time.monotonic() - t0:.0f} s; "
                  f"measuring {count} times", file=sys.stderr, flush=True)  # fmt: skip
            for i in range(count):
                result = workdir / f"m-{s}-{i}.json"
                parser = FlexibleArgumentParser(prog="vllm bench serve")
                add_cli_args(parser)
                flags = parser.parse_args(bench_flags(spec, point, server.base_url, result))
                with open(workdir / f"m-{s}-{i}.log", "w") as log, redirect_stdout(log):
                    bench_main(flags)  # the client's chatter goes to its log, not the report
                data = json.loads(result.read_text())
                if client_failure(data):
                    print(f"  measurement failed: {client_failure(data)}", file=sys.stderr)
                    continue
                metrics, _raw, detail = split_result(data)
                out.append({"server": s, "metrics": metrics, "detail": detail})
    return out


# --------------------------------------------------------------------------- judging


def slowed(m: dict[str, Any], s: float) -> dict[str, Any]:
    """The measurement with a slowdown of ``s`` injected: latencies x (1 + s)."""
    out = copy.deepcopy(m)
    for key, value in out["metrics"].items():
        if key.endswith("_ms"):
            out["metrics"][key] = value * (1 + s)
        elif key.endswith("throughput"):
            out["metrics"][key] = value / (1 + s)
    d = out["detail"]
    for key in ("ttfts", "latencies"):
        d[key] = [x * (1 + s) for x in d[key]]
    d["itls"] = [[x * (1 + s) for x in row] for row in d["itls"]]
    return out


def side(ms: list[dict[str, Any]]) -> v.Side:
    return v.Side([m["metrics"] for m in ms], [m["detail"] for m in ms])


def value(m: dict[str, Any], metric: str) -> float:
    return v.Side([m["metrics"]]).per_repeat(v.parse_metric(metric))[0]


class Tally:
    """Verdicts of one noise source: per metric and per pair."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.verdicts: dict[str, Counter[str]] = defaultdict(Counter)
        self.pairs: list[list[str]] = []

    def add(self, words: dict[str, str]) -> None:
        for metric, word in words.items():
            self.verdicts[metric][word] += 1
        self.pairs.append(list(words.values()))

    def rate(self, words: tuple[str, ...], metric: str | None = None) -> float:
        counts = [self.verdicts[metric]] if metric else list(self.verdicts.values())
        total = sum(sum(c.values()) for c in counts)
        return sum(c[w] for c in counts for w in words) / total if total else float("nan")

    def any_rate(self, words: tuple[str, ...]) -> float:
        hits = [any(w in words for w in pair) for pair in self.pairs]
        return sum(hits) / len(hits) if hits else float("nan")


def judge(
    base: list[dict[str, Any]],
    cand: list[dict[str, Any]],
    history: list[dict[str, Any]] | None = None,
    *,
    requests_decide: bool = False,
    seed: str = "0",
) -> dict[str, str]:
    """Each metric's verdict on one pair (``requests_decide``: the old rule)."""
    words = {}
    for metric in METRICS:
        hist = [value(h, metric) for h in history] if history else None
        r = v.compare_metric(metric, side(base), side(cand), history=hist, seed=seed)
        words[metric] = r.verdict
        if requests_decide and r.change is not None:
            # The old rule: the request-level interval as if it were the run-to-run noise.
            found = v.request_interval(metric, side(base), side(cand), r.change, seed=seed)
            interval = found[0] if found else (-1.0, -1.0)  # none: the threshold decided
            old = v.decide(r.change, interval, None, r.better, v.DEFAULT_THRESHOLD)
            words[metric] = old
    return words


def evaluate(ms: list[dict[str, Any]], slowdowns: list[float]) -> list[tuple[Tally, list[Tally]]]:
    """(A/A tally, one tally per injected slowdown) per noise source."""
    sources: list[tuple[Tally, list[Tally]]] = []

    def run(name: str, pairs: list[tuple[list, list, list | None]], **kw: Any) -> None:
        aa, abs_ = Tally(name), [Tally(name) for _ in slowdowns]
        for i, (base, cand, history) in enumerate(pairs):
            aa.add(judge(base, cand, history, seed=f"aa{i}", **kw))
            for s, ab in zip(slowdowns, abs_, strict=True):
                slow = [slowed(m, s) for m in cand]
                ab.add(judge(base, slow, history, seed=f"ab{i}", **kw))
        sources.append((aa, abs_))

    singles = [([ms[i]], [ms[i + 1]], None) for i in range(0, len(ms) - 1, 2)]
    run("request-level interval decides (old rule)", singles, requests_decide=True)
    run("one repeat, no history", singles)
    with_history = [
        ([ms[i]], [ms[i + 1]], ms[max(0, i + 1 - v.LOOKBACK) : i + 1])
        for i in range(v.MIN_HISTORY - 1, len(ms) - 1)
    ]
    run(f"one repeat + history ({v.MIN_HISTORY}-{v.LOOKBACK} earlier runs)", with_history)
    for r in (2, 3):
        runs = [ms[i : i + r] for i in range(0, len(ms) - r + 1, r)]
        pairs = [(runs[i], runs[i + 1], None) for i in range(0, len(runs) - 1, 2)]
        run(f"repeats: {r} vs {r}", pairs)
    return sources


# --------------------------------------------------------------------------- report


def pct(x: float) -> str:
    return "  -  " if x != x else f"{x * 100:5.1f}%"


def report(
    ms: list[dict[str, Any]], sources: list[tuple[Tally, list[Tally]]], slowdowns: list[float]
) -> None:
    out = [m["metrics"]["output_throughput"] for m in ms]
    servers = len({m["server"] for m in ms})
    print(
        f"\n{len(ms)} measurements of one point (tiny model, vLLM on CPU, {servers} server "
        f"start(s)); output tok/s: median {statistics.median(out):.0f}, min {min(out):.0f}, "
        f"max {max(out):.0f}, cv {statistics.stdev(out) / statistics.fmean(out):.1%}"
    )
    print(
        f"verdict: threshold {v.DEFAULT_THRESHOLD:.0%}, 95% intervals, metrics "
        f"{', '.join(METRICS)}\n"
    )
    detected = "".join(f"  {f'detected +{s:.0%}':>13} {'(any/pair)':>10}" for s in slowdowns)
    head = (
        f"{'noise source':<48} {'pairs':>5}  {'false alarms':>12} {'(any/pair)':>10}  "
        f"{'not measured':>12}{detected}"
    )
    print(head)
    print("-" * len(head))
    for aa, abs_ in sources:
        cells = "".join(
            f"  {pct(ab.rate((v.WORSE,))):>13} {pct(ab.any_rate((v.WORSE,))):>10}" for ab in abs_
        )
        print(
            f"{aa.name:<48} {len(aa.pairs):>5}  {pct(aa.rate(WARNING)):>12} "
            f"{pct(aa.any_rate(WARNING)):>10}  {pct(aa.rate((v.UNMEASURED,))):>12}{cells}"
        )
    print(f"\ntarget: false alarms (per verdict) <= {1 - v.DEFAULT_CONFIDENCE:.0%}")
    print("(any/pair: pairs with at least one such verdict among the metrics)\n")
    names = " ".join(f"{m[:17]:>17}" for m in METRICS)
    for i, s in enumerate(slowdowns):
        print(f"detection of +{s:.0%} per metric (share judged worse):")
        print(f"{'noise source':<48} {names}")
        for _aa, abs_ in sources:
            cells = " ".join(f"{pct(abs_[i].rate((v.WORSE,), m)):>17}" for m in METRICS)
            print(f"{abs_[i].name:<48} {cells}")
        print()
    print("false alarms per metric:")
    print(f"{'noise source':<48} {names}")
    for aa, _abs in sources:
        cells = " ".join(f"{pct(aa.rate(WARNING, m)):>17}" for m in METRICS)
        print(f"{aa.name:<48} {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measurements", type=int, default=96)
    parser.add_argument("--servers", type=int, default=3, help="server starts, one after another")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--slowdown",
        type=float,
        nargs="+",
        default=[0.2, 0.5],
        help="injected slowdowns, e.g. 0.2 = 20%% (default: 0.2 0.5)",
    )
    parser.add_argument("--save", type=Path, help="write the measurements to this file")
    parser.add_argument("--load", type=Path, help="judge measurements saved before")
    args = parser.parse_args()
    t0 = time.monotonic()
    if args.load:
        ms = json.loads(args.load.read_text())
    else:
        ms = measure(args)
        if args.save:
            args.save.write_text(json.dumps(ms))
    t1 = time.monotonic()
    sources = evaluate(ms, args.slowdown)
    report(ms, sources, args.slowdown)
    print(f"\nmeasuring {t1 - t0:.0f} s, judging {time.monotonic() - t1:.0f} s", flush=True)
    sys.stderr.flush()
    if not args.load:
        # vLLM's in-process client loaded triton, whose teardown prints a page of
        # "nanobind: leaked ..." lines: the results are out, skip the teardown.
        os._exit(0)


if __name__ == "__main__":
    main()
