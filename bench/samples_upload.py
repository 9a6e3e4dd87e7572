"""What a large point's per-request samples cost in memory on the way to the portal
(issue 27): inline in the measurement (how every point travelled before) against streamed
on their own (``runners.samplesfile``: the full arrays written to a gzip file a slice at a
time and uploaded as a stream; the measurement carries a reading sample).

For each point size (requests x output tokens), six fresh processes measure the peak
resident memory a step adds (Linux's VmHWM, reset just before the step, against the
process's size then):

- merge, held: ``runners.clientmerge.merge`` of the point's requests split over four
  clients' result files, the union in memory (how every merge ran before);
- merge, spilled: the same with a spill directory (``runners.spilled``): past the inline
  limit the union's token gaps go to a file, and the merge writes the samples file and a
  reading sample;
- runner, inline: the measurement's JSON body and its gzip copy (``runners.report.encode``);
- runner, streamed: the samples file, the reading sample and its measurement's body;
- portal, inline: what ingestion does with the inline body: inflate it, parse it, validate
  it (``runners.result.Measurement``) and encode the samples object it stores;
- portal, streamed: ``samplestore.save_stream`` of the upload (a temporary file, then the
  samples directory), then the same as inline for the reading sample's measurement.

The runner processes hold the point's arrays as Python lists before the step (vLLM's client
wrote them so); the portal processes start from the body on disk. Prints MB and the ratios
inline / streamed, side by side in one run. A benchmark: nothing asserts.

    python bench/samples_upload.py [--points 20000x128,60000x128] [--inline-values 2000000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STEPS = (
    "merge-held", "merge-spilled", "runner-inline", "runner-streamed", "portal-inline",
    "portal-streamed",
)  # fmt: skip
CLIENTS = 4


def point(requests: int, tokens: int) -> dict[str, Any]:
    """A succeeded measurement of ``requests`` x ``tokens`` with every per-request array."""
    from runners.result import PointInfo

    rng = random.Random(0)
    ttfts = [0.05 + rng.random() * 0.02 for _ in range(requests)]
    itls = [[0.004 + rng.random() * 0.001 for _ in range(tokens - 1)] for _ in range(requests)]
    shape = PointInfo(
        key="single", sweep="single", input_len=64, output_len=tokens, max_concurrency=64,
        num_prompts=requests,
    )  # fmt: skip
    return {
        "backend": "vllm",
        "backend_kind": "vllm",
        "point": shape.model_dump(),
        "repeat": 0,
        "status": "succeeded",
        "metrics": {"completed": requests, "duration": 100.0},
        "detail": {
            "input_lens": [64] * requests,
            "output_lens": [tokens] * requests,
            "ttfts": ttfts,
            "itls": itls,
            "latencies": [t + sum(g) for t, g in zip(ttfts, itls, strict=True)],
            "errors": [""] * requests,
        },
        "started_at": "2026-12-07T06:00:00.000+00:00",
        "finished_at": "2026-12-07T06:10:00.000+00:00",
        "duration_s": 600.0,
    }


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _rss_mb() -> float:
    """The resident size now; the peak (VmHWM) is reset to it (Linux's clear_refs 5), so
    ``_peak_mb`` then reads the step's own peak, not the building of its input."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_mb("VmRSS")


def _peak_mb() -> float:
    return _status_mb("VmHWM")


def _ingest(body: bytes) -> None:
    """What the portal does with an inline measurement body (compressed)."""
    from portal.benchmarks import samplestore
    from portal.lib.gzipbody import inflate
    from runners.result import Measurement

    data = json.loads(inflate(body, 1 << 40))
    m = Measurement.model_validate(data)
    del data
    samplestore.encode(m.detail)


def child(step: str, size: str, workdir: Path, limit: int) -> dict[str, float]:
    """One step in this (fresh) process; returns {before, peak, seconds}."""
    requests, tokens = (int(x) for x in size.split("x"))
    os.environ["SERVEBENCH_SAMPLES_INLINE_VALUES"] = str(limit)
    out: dict[str, float] = {}
    if step.startswith("merge"):
        from runners import clientmerge

        paths = sorted(workdir.glob("client-*.json"))
        out["before"] = _rss_mb()
        t0 = time.perf_counter()
        if step == "merge-held":
            clientmerge.merge(paths)
        else:
            clientmerge.merge(paths, spill=workdir / "spill", inline_limit=limit)
    elif step.startswith("runner"):
        from runners import samplesfile
        from runners.report import encode
        from runners.result import Measurement

        m = Measurement.model_validate(point(requests, tokens))
        out["before"] = _rss_mb()
        t0 = time.perf_counter()
        if step == "runner-inline":
            encode(m.model_dump(mode="json"))
        else:
            samplesfile.write_file(m.detail, workdir / "full.json.gz")
            sample, _kept = samplesfile.reading_sample(m.detail, limit, "x")
            encode(m.model_copy(update={"detail": sample}).model_dump(mode="json"))
    else:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
        os.environ.setdefault("DEBUG", "true")
        os.environ["SERVEBENCH_SAMPLES_DIR"] = str(workdir / "samples")
        import django

        django.setup()
        from portal.benchmarks import samplestore

        out["before"] = _rss_mb()
        t0 = time.perf_counter()
        if step == "portal-inline":
            _ingest((workdir / "inline.body").read_bytes())
        else:
            full = workdir / "full.json.gz"
            digest = (workdir / "full.sha256").read_text()
            with open(full, "rb") as body:
                samplestore.save_stream(
                    "bench/full.json.gz", body, full.stat().st_size, digest, 1 << 40
                )
            _ingest((workdir / "sample.body").read_bytes())
    out["seconds"] = time.perf_counter() - t0
    out["peak"] = _peak_mb()
    return out


def prepare(size: str, workdir: Path, limit: int) -> None:
    """The bodies the portal steps read: the inline measurement, the full samples file and
    the reading sample's measurement."""
    from runners import samplesfile
    from runners.report import encode

    requests, tokens = (int(x) for x in size.split("x"))
    body = point(requests, tokens)
    data, _ = encode(body)
    (workdir / "inline.body").write_bytes(data)
    _size, digest = samplesfile.write_file(body["detail"], workdir / "full.json.gz")
    (workdir / "full.sha256").write_text(digest)
    sample, _ = samplesfile.reading_sample(body["detail"], limit, "x")
    (workdir / "sample.body").write_bytes(encode(body | {"detail": sample})[0])
    for i in range(CLIENTS):  # vLLM's --save-detailed files of four clients
        share = {k: v[i::CLIENTS] for k, v in body["detail"].items()}
        share["start_times"] = [j * 0.001 for j in range(i, requests, CLIENTS)]
        share["num_prompts"] = len(share["ttfts"])
        (workdir / f"client-{i}.json").write_text(json.dumps(share))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", default="20000x128,60000x128")
    parser.add_argument("--inline-values", type=int, default=2_000_000)
    parser.add_argument("--child", nargs=3, metavar=("STEP", "SIZE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        step, size, workdir = args.child
        print(json.dumps(child(step, size, Path(workdir), args.inline_values)))
        return
    print(f"inline limit {args.inline_values:,} numbers; MB a step adds to its process's peak")
    print(f"{'point':>12} {'numbers':>12} {'gzip MB':>8} " + " ".join(f"{s:>16}" for s in STEPS))
    for size in args.points.split(","):
        requests, tokens = (int(x) for x in size.split("x"))
        with tempfile.TemporaryDirectory(prefix="sb-samples-bench-") as tmp:
            workdir = Path(tmp)
            prepare(size, workdir, args.inline_values)
            found = {}
            for step in STEPS:
                done = subprocess.run(
                    [sys.executable, __file__, "--inline-values", str(args.inline_values),
                     "--child", step, size, str(workdir)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                found[step] = json.loads(done.stdout.strip().splitlines()[-1])
            gz_mb = (workdir / "full.json.gz").stat().st_size / 2**20
        numbers = requests * (tokens - 1) + 5 * requests
        cells = [
            f"{found[s]['peak'] - found[s]['before']:>9.0f} ({found[s]['seconds']:>4.1f}s)"
            for s in STEPS
        ]
        print(f"{size:>12} {numbers:>12,} {gz_mb:>8.0f} " + " ".join(f"{c:>16}" for c in cells))
        for side in ("merge", "runner", "portal"):
            a, b = ("held", "spilled") if side == "merge" else ("inline", "streamed")
            first = found[f"{side}-{a}"]["peak"] - found[f"{side}-{a}"]["before"]
            second = found[f"{side}-{b}"]["peak"] - found[f"{side}-{b}"]["before"]
            print(f"{'':>12} {side}: {a} / {b} = {first / max(second, 1):.1f}x")


if __name__ == "__main__":
    main()
