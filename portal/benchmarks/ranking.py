"""Which served configuration is best, and why: one ranking for the run page, the API
and ``servebench results``.

A run with two or more served configurations (a configuration search's, or any vLLM,
endpoint or transformers-serve backends) is ranked here:

- with an SLA search: by its answer, the highest load that met the SLO ("goodput at the
  SLO"), then by the output tok/s measured at that load; a configuration without an answer
  (below range, dropped by early dropping, not measured within the budget) ranks after
  every one with an answer, with its reason;
- without one: by output tok/s per GPU at its best load point.

Each row also carries, at the point it is ranked by: output tok/s per GPU (over the GPUs
one server uses, ``VLLMBackend.gpus_per_server``; per server on a CPU run), per user
(``points.efficiency``: 1000 / median TPOT, one user's decode speed), joules per output
token and cost per million output tokens (NVML and a GPU-hour price: "unknown" where
either is missing, as on a CPU), and what limited it (``runners.bottleneck`` through
``PointStats.bottleneck``). The Pareto front of per GPU against per user is taken over
every load point of every ranked configuration. ``why`` says why the winner wins: its
answer and throughput against the runner-up's, and each one's bottleneck there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from portal.benchmarks import commands
from portal.benchmarks import points as pts
from portal.benchmarks.runview import LoadedRun
from runners import spec as rs

SERVED_KINDS = ("vllm", "endpoint", "transformers-serve")
UNKNOWN = "unknown"
_ENERGY = "energy_per_output_token_j"
_COST = "cost_per_million_output_tokens"


@dataclass
class Entry:
    """One configuration's row: where it ranks, at which point, and its numbers there."""

    backend: str
    kind: str
    state: str  # measured, dropped, not measured, below range, failed, running, pending
    reason: str
    gpus: int  # GPUs one server uses (0: a CPU run, numbers per server)
    overrides: dict[str, Any] = field(default_factory=dict)
    rank: int | None = None
    answer: float | None = None
    answer_text: str = ""
    point: pts.PointStats | None = None
    serve_command: str = ""

    def value(self, key: str) -> float | None:
        return self.point.get(key) if self.point is not None else None

    @property
    def throughput(self) -> float | None:
        return self.value("output_throughput")

    @property
    def per_gpu(self) -> float | None:
        xy = pts.efficiency(self.point, self.gpus) if self.point is not None else None
        return xy[1] if xy else _per(self.throughput, self.gpus)

    @property
    def per_user(self) -> float | None:
        xy = pts.efficiency(self.point, self.gpus) if self.point is not None else None
        return xy[0] if xy else None

    @property
    def bottleneck(self) -> dict[str, str] | None:
        found = self.point.bottleneck if self.point is not None else None
        return found.as_dict() if found is not None else None

    @property
    def noise(self) -> pts.Uncertainty | None:
        """The 95% interval of its output tok/s at that point: over its repeats, else over
        the requests of its one repeat; None when neither was measured."""
        return self.point.uncertainty("output_throughput") if self.point is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "backend": self.backend,
            "kind": self.kind,
            "state": self.state,
            "reason": self.reason,
            "overrides": self.overrides,
            "answer": self.answer,
            "answer_text": self.answer_text,
            "point": self.point.point_key if self.point is not None else None,
            "gpus_per_server": self.gpus,
            "output_throughput": self.throughput,
            "output_throughput_interval": _interval(self.noise),
            "output_throughput_per_gpu": self.per_gpu,
            "output_throughput_per_user": self.per_user,
            "energy_per_output_token_j": self.value(_ENERGY),
            "cost_per_million_output_tokens": self.value(_COST),
            "bottleneck": self.bottleneck,
            "serve_command": self.serve_command or None,
        }


@dataclass
class Ranking:
    """The ranked rows (best first, unranked last), what they are ranked by, the Pareto
    points, and why the winner wins."""

    entries: list[Entry]
    by: str
    front: list[dict[str, Any]]
    why: str
    per: str  # "GPU", or "server" on a CPU run

    @property
    def winner(self) -> Entry | None:
        first = self.entries[0] if self.entries else None
        return first if first is not None and first.rank == 1 else None

    def as_dict(self) -> dict[str, Any]:
        winner = self.winner
        return {
            "by": self.by,
            "per": self.per,
            "winner": winner.backend if winner else None,
            "why": self.why,
            "entries": [e.as_dict() for e in self.entries],
            "pareto": self.front,
        }


def spread(noise: pts.Uncertainty | None) -> str:
    """'±3.1%', 'unbounded', or '' when the noise was not measured."""
    if noise is None:
        return ""
    return "unbounded" if noise.relative == float("inf") else f"±{noise.relative:.1%}"


def _interval(noise: pts.Uncertainty | None) -> dict[str, Any] | None:
    if noise is None:
        return None
    return {
        "low": noise.low,
        "high": noise.high,
        "method": noise.method,
        "repeats": noise.repeats,
        "spread": spread(noise),
        "text": noise.describe(),
    }


def _per(value: float | None, gpus: int) -> float | None:
    return value / max(gpus, 1) if value is not None else None


def _gpus(backend: Any, run_gpus: int) -> int:
    if run_gpus <= 0:
        return 0
    return backend.gpus_per_server if isinstance(backend, rs.VLLMBackend) else 1


def _run_gpus(view: LoadedRun) -> int:
    identity = view.identity
    count = identity.measurement["gpu"]["count"] if identity is not None else None
    return count if isinstance(count, int) else (view.run.gpu_count or 0)


def rank(
    view: LoadedRun,
    searches: list[dict[str, Any]] | None = None,
    outcomes: list[dict[str, Any]] | None = None,
) -> Ranking | None:
    """The run's ranking, or None when it has fewer than two served configurations.
    ``searches``: ``ingestion.sla_searches``; ``outcomes``: ``ingestion.config_outcomes``
    (each read once by the caller: the page and the API already have them)."""
    spec, results = view.spec, view.results
    if spec is None or results is None:
        return None
    served = spec.served_backends
    if len(served) < 2:
        return None
    run_gpus = _run_gpus(view)
    by_search = {s["backend"]: s for s in searches or []}
    by_outcome = {o["name"]: o for o in outcomes or []}
    points: dict[str, list[pts.PointStats]] = {}
    for p in results.points:
        if p.ok and p.backend_kind in SERVED_KINDS:
            points.setdefault(p.backend, []).append(p)
    entries = [
        _entry(spec, b, run_gpus, points.get(b.name, []), by_search, by_outcome) for b in served
    ]
    # The noise of each ranked number (one query for those measured once; a page that
    # already attached them pays nothing).
    pts.attach_point_intervals([e.point for e in entries if e.point is not None])
    searched = spec.sla_search is not None and any(e.backend in by_search for e in entries)
    if searched:
        by = f"the highest load meeting {spec.sla_search.describe_slo()}, then output tok/s there"  # type: ignore[union-attr]

        def key(e: Entry) -> tuple[float, float]:
            return (e.answer if e.answer is not None else -1.0, e.throughput or 0.0)

        ranked = [e for e in entries if e.answer is not None]
    else:
        by = "output tok/s per GPU at its best load point"

        def key(e: Entry) -> tuple[float, float]:
            return (e.per_gpu or 0.0, e.throughput or 0.0)

        ranked = [e for e in entries if e.per_gpu is not None]
    ranked.sort(key=key, reverse=True)
    for i, e in enumerate(ranked):
        e.rank = i + 1
    rest = [e for e in entries if e.rank is None]
    ordered = ranked + rest
    if ordered and ordered[0].rank == 1:
        ordered[0].serve_command = commands.implied(
            spec, ordered[0].backend, ordered[0].point.point_key if ordered[0].point else ""
        ).get("serve", "")
    per = "GPU" if run_gpus > 0 else "server"
    return Ranking(ordered, by, _front(ordered, points), _why(ordered, searched), per)


def _entry(
    spec: rs.Spec,
    backend: Any,
    run_gpus: int,
    points: list[pts.PointStats],
    searches: dict[str, dict[str, Any]],
    outcomes: dict[str, dict[str, Any]],
) -> Entry:
    gpus = _gpus(backend, run_gpus)
    outcome = outcomes.get(backend.name) or {}
    entry = Entry(
        backend.name,
        backend.kind,
        str(outcome.get("state") or "measured"),
        str(outcome.get("reason") or ""),
        gpus,
        dict(outcome.get("overrides") or {}),
    )
    search = searches.get(backend.name)
    if search is not None:
        entry.answer = search.get("answer")
        entry.answer_text = str(search.get("text") or "")
        if search.get("state") in ("below range", "dropped", "stopped") and entry.answer is None:
            entry.state = "dropped" if search["state"] == "dropped" else search["state"]
        entry.reason = entry.reason or entry.answer_text
        if entry.answer is not None:
            key = rs.search_point(spec, entry.answer).key
            entry.point = next((p for p in points if p.point_key == key), None)
        return entry
    loads = [p for p in points if p.axis in pts.LOAD_AXES] or points
    if loads:
        entry.point = max(
            loads,
            key=lambda p: (_per(p.get("output_throughput"), gpus) or 0.0, p.x),
        )
    elif not entry.reason:
        entry.state, entry.reason = "failed", "no point succeeded"
    return entry


def _front(entries: list[Entry], points: dict[str, list[pts.PointStats]]) -> list[dict[str, Any]]:
    """Every load point of the ranked configurations as (per user, per GPU), and whether
    it is on the Pareto front (no other point is higher on both)."""
    found = []
    for e in entries:
        for p in points.get(e.backend, []):
            if p.axis not in pts.LOAD_AXES:
                continue
            xy = pts.efficiency(p, e.gpus)
            if xy is not None:
                found.append((e.backend, p, xy))
    front = set(pts.higher_front([xy for _, _, xy in found]))
    return [
        {
            "backend": backend,
            "point": p.point_key,
            "load": p.short,
            "per_user": round(xy[0], 3),
            "per_gpu": round(xy[1], 3),
            "front": i in front,
        }
        for i, (backend, p, xy) in enumerate(found)
    ]


def _limited(e: Entry) -> str:
    found = e.bottleneck
    if found is None or found["cause"] == "unknown":
        return f"what limited {e.backend} there is unknown"
    return f"{e.backend} was limited by {found['cause']} ({found['sentence'].rstrip('.')})"


def _limits(win: Entry, second: Entry | None) -> str:
    """Each one's bottleneck at the point it is ranked by, said once when they agree."""
    if second is None:
        return f"{_limited(win)[0].upper()}{_limited(win)[1:]}."
    a, b = win.bottleneck, second.bottleneck
    cause_a = a["cause"] if a else "unknown"
    cause_b = b["cause"] if b else "unknown"
    if cause_a == cause_b == "unknown":
        sentence = (a or b or {}).get("sentence", "").removeprefix("Unknown: ").rstrip(".")
        why = f" ({sentence})" if sentence else ""
        return f"What limited either there is unknown{why}."
    if cause_a == cause_b:
        return f"Both were limited by {cause_a} there: the winner went further under it."
    return f"At those points {_limited(win)}; {_limited(second)}."


def _why(entries: list[Entry], searched: bool) -> str:
    """Why the winner wins, in a few sentences with the numbers and the bottlenecks."""
    ranked = [e for e in entries if e.rank is not None]
    if not ranked:
        return "No configuration has a result to rank yet."
    win = ranked[0]
    tput = f"{win.throughput:.4g} output tok/s" if win.throughput is not None else "no throughput"
    at = win.point.short if win.point else "its best point"
    if searched:
        head = f"{win.backend} wins: {win.answer_text} ({tput} there)."
    else:
        per = win.per_gpu
        head = f"{win.backend} wins: {per:.4g} output tok/s per GPU at {at}." if per else ""
    if len(ranked) < 2:
        dropped = [e for e in entries if e.rank is None]
        if dropped:
            head += f" The others have no answer ({', '.join(e.backend for e in dropped)})."
        return f"{head} {_limits(win, None)}"
    second = ranked[1]
    if searched:
        other = second.answer_text.split(" at ")[0] or "no answer"
        vs = f" The runner-up {second.backend} met it up to {other}"
        if second.throughput is not None:
            vs += f" ({second.throughput:.4g} output tok/s)"
        vs += "."
    else:
        vs = f" The runner-up {second.backend}: {second.per_gpu or 0:.4g} per GPU."
    tied = not searched or win.answer == second.answer
    noise = f" {_settled(win, second)}" if tied else ""
    return f"{head}{vs}{noise} {_limits(win, second)}"


def _settled(win: Entry, second: Entry) -> str:
    """Whether the throughput that puts the winner first is beyond noise: their 95%
    intervals (per GPU where they use different GPU counts) apart, or overlapping."""
    a, b = win.noise, second.noise
    if a is None or b is None or not win.throughput or not second.throughput:
        missing = ", ".join(e.backend for e, n in ((win, a), (second, b)) if n is None)
        return (
            f"Whether that gap is beyond noise is unknown: no interval for {missing} "
            "(measure with repeats: 3 to know)."
        )
    scale_a = (win.per_gpu or win.throughput) / win.throughput
    scale_b = (second.per_gpu or second.throughput) / second.throughput
    both = f"{spread(a)} and {spread(b)}, 95%"
    if a.low * scale_a > b.high * scale_b:
        return f"The gap is beyond noise ({both})."
    return (
        f"The gap is within noise ({both}): which of the two is faster is not settled; "
        "measure both again with more repeats (repeats: 3 or more) to separate them."
    )
