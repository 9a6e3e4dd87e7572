"""One line per step on stderr, so a person watching a run knows where it is.

    [3/9] vllm concurrency:max_concurrency=16 r0  output 1115.2 tok/s  p99 TTFT 812 ms

A measurement taken under CPU contention says so on its line, with the runner's reasons.

stdout stays free for machine-readable output (``schema``, ``env``).
"""

from __future__ import annotations

import sys
from typing import TextIO

from runners.result import Measurement


def measurement_line(done: int, total: int, m: Measurement) -> str:
    head = f"[{done}/{total}] {m.backend} {m.point.key} r{m.repeat}"
    if m.status == "failed":
        first = (m.error or "failed").strip().splitlines()[0][:200]
        return f"{head}  FAILED: {first}"
    out = m.metrics.get("output_throughput")
    ttft = m.metrics.get("p99_ttft_ms")
    parts = [head]
    if out is not None:
        parts.append(f"output {out:.1f} tok/s")
    if ttft is not None:
        parts.append(f"p99 TTFT {ttft:.0f} ms")
    if m.conditions.get("contended"):
        reasons = m.conditions.get("reasons") or ["see its conditions"]
        parts.append(f"CONTENDED: {'; '.join(reasons)[:240]}")
    return "  ".join(parts)


class Progress:
    """Writes status lines to ``stream`` (stderr by default); ``quiet`` silences it."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            print(text, file=self.stream, flush=True)

    def measurement(self, done: int, total: int, m: Measurement) -> None:
        self.say(measurement_line(done, total, m))
