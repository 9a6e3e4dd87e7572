"""``workload.clients: auto``: how many load generators a served backend needs.

One bench client is one process with one event loop; past its capacity it, not the
server, sets the numbers (``runners.bottleneck`` says so after the fact). With ``auto``
the runner finds the count before it measures a backend, against the running server:

- **Where**: the backend's heaviest point (the highest request rate, else the highest
  concurrency, of ``spec.points()``), its prompts capped at ``PROBE_PROMPTS`` (or four
  rounds of its concurrency, ten seconds of its rate, if more) so a probe stays short.
- **How**: 1 client, then 2, 3, ... (each a full measurement with the point's warm-ups
  and synchronized start: ``runners.multiclient``), while each added client raises the
  achieved request rate by at least ``MIN_GAIN`` over the best so far; it stops at the
  first that does not, at a failed probe, or at the limit: the cores the clients have
  (more clients than cores share them and add contention, not capacity), the point's
  prompts and, under concurrency, its requests in flight, and ``MAX_AUTO``.
- **What it says**: every count tried with its achieved rate and whether that client
  was saturated (``runners.bottleneck.saturated``), the count chosen and why, in the
  run's environment (``load_generators``), which a comparison diffs like any other knob.

The probes are not measurements of the run: their files stay in the work directory's
``clients-probe/`` and nothing of them is ranked or plotted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runners import bottleneck
from runners.result import Measurement
from runners.spec import Point, Spec

MIN_GAIN = 0.10  # an added client must raise the achieved request rate by this much
MAX_AUTO = 8  # clients the probe tries at most
PROBE_PROMPTS = 200


def heaviest(spec: Spec) -> Point:
    """The point of the spec with the most load: the highest rate, else concurrency."""
    return max(
        spec.points(),
        key=lambda p: (p.request_rate or 0.0, p.max_concurrency, p.num_prompts),
    )


def probe_point(point: Point) -> Point:
    """``point`` with its prompts capped for a probe (key ``clients-probe``)."""
    if point.request_rate:
        enough = max(PROBE_PROMPTS, int(point.request_rate * 10))
    else:
        enough = max(PROBE_PROMPTS, 4 * point.max_concurrency)
    return point.model_copy(
        update={"sweep": "clients-probe", "num_prompts": min(point.num_prompts, enough)}
    )


def limit(point: Point, cores: int) -> int:
    """How many clients the probe may try at ``point`` with ``cores`` for them."""
    n = min(MAX_AUTO, max(cores, 1), point.num_prompts)
    if point.request_rate is None:
        n = min(n, point.max_concurrency)
    return max(n, 1)


@dataclass
class Probe:
    """What the probe tried and chose for one backend."""

    backend: str
    point: str
    limit: int
    tried: list[dict[str, Any]] = field(default_factory=list)
    chosen: int = 1
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "point": self.point,
            "limit": self.limit,
            "tried": self.tried,
            "chosen": self.chosen,
            "why": self.why,
        }


def _saturated(m: Measurement) -> str | None:
    """Why the (first) saturated client of ``m`` was the limit, or None."""
    for facts in (m.conditions or {}).get("clients") or []:
        if isinstance(facts, dict) and (why := bottleneck.saturated(facts)):
            return why
    return None


def _plural(n: int) -> str:
    return f"{n} client{'s' if n != 1 else ''}"


def choose(tried: list[dict[str, Any]], at_limit: bool) -> tuple[int, str]:
    """The count to use from the probes so far (in order 1, 2, ...) and why, in words:
    the last count whose rate beat the best before it by ``MIN_GAIN``."""
    chosen, best = 1, None
    said: list[str] = []
    stop = ""
    for t in tried:
        n, rate = t["clients"], t.get("request_throughput")
        if rate is None:
            stop = f"{_plural(n)} failed ({t.get('error') or 'no result'})"
            break
        if best is None:
            chosen, best = n, rate
            said.append(f"{_plural(n)} {rate:.4g} req/s")
            continue
        gain = rate / best - 1 if best else float("inf")
        said.append(f"{_plural(n)} {rate:.4g} req/s ({gain:+.0%})")
        if gain < MIN_GAIN:
            stop = f"{_plural(n)} added less than {MIN_GAIN:.0%}"
            break
        chosen, best = n, rate
    else:
        if at_limit:
            stop = f"{_plural(tried[-1]['clients'])} is the most this point and these cores allow"
    why = ", ".join(said) + (f"; {stop}" if stop else "") + f": {_plural(chosen)}."
    return chosen, why


def run(backend: str, point: Point, cap: int, measure: Callable[[int], Measurement]) -> Probe:
    """Probe ``point`` with 1, 2, ... clients (``measure(n)``) up to ``cap``; the count
    chosen (``choose``) and what each probe achieved."""
    probe = Probe(backend, point.key, cap)
    if cap <= 1:
        probe.why = "one core for the clients (or one request at a time): 1 client, no probe."
        return probe
    for n in range(1, cap + 1):
        m = measure(n)
        metrics = m.metrics or {}
        probe.tried.append(
            {
                "clients": n,
                "request_throughput": metrics.get("request_throughput")
                if m.status == "succeeded"
                else None,
                "output_throughput": metrics.get("output_throughput"),
                "saturated": _saturated(m),
                "error": (m.error or "").splitlines()[0][:200] if m.status != "succeeded" else None,
            }
        )
        chosen, why = choose(probe.tried, at_limit=n == cap)
        probe.chosen, probe.why = chosen, why
        if chosen != n or probe.tried[-1]["request_throughput"] is None:
            break  # this count did not pay, or failed: stop here
    return probe
