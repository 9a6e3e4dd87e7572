"""SLA search: the highest request rate or concurrency at which a backend meets an SLO.

The question a capacity plan asks ("how far can we push it within p99 TTFT <= 500 ms?")
answered by measuring, not by reading it off a sweep chosen in advance. The search
(``spec.sla_search``, ``runners.spec.SLASearch``) adds points as it learns:

1. the low end of the range: if it fails, nothing in the range meets the SLO (stop);
2. the high end: if it passes, the whole range does (stop: the limit may lie higher);
3. bisection, in log space (loads span orders of magnitude), between the highest load
   that met the SLO and the lowest that did not, until the two are within ``tolerance``
   of each other (a concurrency: adjacent, or within tolerance), a midpoint rounds onto a
   load already measured, or ``max_points`` points were measured.

A stall of the machine, the network or a neighbour only ever adds latency: a pass is
evidence, a single miss may be noise. So a load that missed (it ran, its latency was over
a limit; a point that failed outright is believed) is measured once more
(repeat 1, same key) before the search believes it, where ``confirm`` says so: by default
the low end only, whose miss would end the search with no answer at all ("below range"
after one unlucky measurement was what a 3-second stall of a shared machine did);
``failures`` every miss. A load's verdict is its last measurement's; every measurement
counts against the budget and shows in the path.

Each step is an ordinary measurement (vLLM's bench client, its metric definitions) under
the key ``<name>:<axis>=<value>``. A point meets the SLO when it succeeded and each
limited metric (``p99_ttft_ms``...) is at most its limit; a failed point does not.
Rates are rounded to three significant figures, concurrencies to whole numbers, so the
keys stay readable and a search cannot creep forever.

The answer is the highest load that met the SLO below the lowest that did not, with the
path that led there ("12.5 req/s at p99 TTFT <= 500 ms"). A run that ended mid-search
(its server died, it was cancelled, it timed out) says what it learned as a bound, state
``stopped`` ("at least 4 req/s ..."), never as an answer or as still running.
In a configuration search (``spec.config_search``) with early dropping, a configuration
after the first starts at a gate (``gates``): the best answer among those searched before
it. A miss there, confirmed as a miss at the low end is, ends its search (state
``dropped``: it cannot beat the leader); a pass continues it above the gate as above.

Everything here is a pure function of the spec and the measurements (mappings shaped like
the result document's), so the runner (driving the search), the portal (result document,
ingestion, the run page) and the CLI compute the same answer from the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from runners.spec import SLASearch, Spec, slo_text

T = TypeVar("T")

UNITS = {"request_rate": "req/s", "max_concurrency": "concurrent requests"}


@dataclass(frozen=True)
class Step:
    """One measured load of a search and its verdict."""

    value: float
    passed: bool
    point_key: str
    status: str
    metrics: dict[str, float | None] = field(default_factory=dict)
    reason: str = ""
    repeat: int = 0  # 1: the load measured again after it missed (``confirm``)


def _get(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def judge(search: SLASearch, status: str, metrics: Mapping[str, Any]) -> tuple[bool, str]:
    """(met, why not): met when the point succeeded and every limited metric is within."""
    if status != "succeeded":
        return False, "the point failed"
    missed = []
    for key, limit in search.slo.items():
        value = metrics.get(key)
        if not isinstance(value, int | float):
            missed.append(f"{key} was not measured")
        elif value > limit:
            missed.append(f"{slo_text(key, limit).split(' <=')[0]} {value:.4g} ms > {limit:g}")
    return not missed, "; ".join(missed)


def round_value(search: SLASearch, value: float) -> float:
    """A load as the search measures it: a whole concurrency, a rate to 3 figures."""
    if search.axis == "max_concurrency":
        return float(max(1, round(value)))
    return float(f"{value:.3g}")


def _shown(value: float) -> str:
    return f"{value:g}"


def _converged(search: SLASearch, best: float, fail: float) -> bool:
    if search.axis == "max_concurrency" and fail - best <= 1:
        return True
    return fail / best - 1 <= search.tolerance


def verdicts(steps: list[Step]) -> dict[float, bool]:
    """Each measured load's verdict: its last measurement's (a confirmation overrides)."""
    return {s.value: s.passed for s in steps}


def confirms(search: SLASearch, value: float) -> bool:
    if search.confirm == "failures":
        return True
    return search.confirm == "low" and value == round_value(search, search.low)


def next_repeat(steps: list[Step], value: float) -> int:
    """The repeat index of ``value``'s next measurement: 0 new, 1 a confirmation."""
    return int(any(s.value == value for s in steps))


@dataclass(frozen=True)
class Gate:
    """Early dropping in a configuration search: the load a configuration is measured at
    first, the leader's answer (``leader``: the configuration that met the SLO there). A
    miss there (confirmed as the low end's would be) means it cannot beat the leader."""

    value: float
    leader: str


def next_value(search: SLASearch, steps: list[Step], gate: Gate | None = None) -> float | None:
    """The next load to measure, or None when the search is over (see the module doc);
    the load just measured again when it missed and ``confirm`` asks for it. With a
    ``gate``: its load first; a miss there ends the search (dropped), a pass continues it
    above."""
    if len(steps) >= search.max_points:
        return None
    if not steps:
        return gate.value if gate else round_value(search, search.low)
    last = steps[-1]
    if (
        not last.passed
        and last.status == "succeeded"  # a latency miss; a failed point is believed
        and last.repeat == 0
        and (
            confirms(search, last.value)
            or (gate is not None and last.value == gate.value and search.confirm != "none")
        )
    ):
        return last.value
    if gate is not None and dropped(steps, gate):
        return None
    verdict = verdicts(steps)
    measured = set(verdict)
    fails = [v for v, ok in verdict.items() if not ok]
    lowest_fail = min(fails) if fails else None
    low = round_value(search, search.low)
    if lowest_fail is not None and lowest_fail <= low:
        return None  # even the low end misses the SLO
    if lowest_fail is None:
        high = round_value(search, search.high)
        return None if high in measured else high
    best = max(v for v, ok in verdict.items() if ok and v < lowest_fail)
    if _converged(search, best, lowest_fail):
        return None
    mid = round_value(search, math.sqrt(best * lowest_fail))
    if search.axis == "max_concurrency":
        mid = min(max(mid, best + 1), lowest_fail - 1)
    if mid in measured or not best < mid < lowest_fail:
        return None  # rounding leaves nothing between them
    return mid


def dropped(steps: list[Step], gate: Gate | None) -> bool:
    """Whether the search missed the SLO at its gate (its verdict there, after any
    confirmation): dropped, it cannot beat the leader."""
    return gate is not None and verdicts(steps).get(gate.value) is False


def gates(spec: Spec, measurements: Iterable[Any]) -> dict[str, Gate]:
    """Each configuration's gate (``Gate``) in a configuration search with early dropping:
    the best answer among the configurations searched before it, in order, once their
    searches finished. The runner measures configurations in this order, so the runner,
    the portal and the CLI agree on every gate from the same measurements."""
    search, configs = spec.sla_search, spec.config_search
    if search is None or configs is None or not configs.early_drop:
        return {}
    items = list(measurements)
    searched = {b.name for b in spec.search_backends}
    out: dict[str, Gate] = {}
    leader: Gate | None = None
    for name in spec.config_names:
        if name not in searched:
            continue
        if leader is not None:
            out[name] = leader
        steps = steps_of(spec, name, items)
        if next_value(search, steps, out.get(name)) is not None:
            break  # unfinished: nothing after it has a gate yet
        answer = _answer(steps)
        if answer is not None and (leader is None or answer > leader.value):
            leader = Gate(answer, name)
    return out


def _answer(steps: list[Step]) -> float | None:
    verdict = verdicts(steps)
    fails = [v for v, ok in verdict.items() if not ok]
    lowest_fail = min(fails) if fails else None
    passing = [v for v, ok in verdict.items() if ok and (lowest_fail is None or v < lowest_fail)]
    return max(passing) if passing else None


def search_value(spec: Spec, point_key: str) -> float | None:
    """The load of an SLA search point key ('sla:request_rate=12.5'), or None when the key
    is not one of this spec's search keys or lies outside its range."""
    search = spec.sla_search
    if search is None:
        return None
    prefix = f"{search.name}:{search.axis}="
    if not point_key.startswith(prefix):
        return None
    try:
        value = float(point_key[len(prefix) :])
    except ValueError:
        return None
    if not math.isfinite(value) or round_value(search, value) != value:
        return None
    if not round_value(search, search.low) <= value <= round_value(search, search.high):
        return None
    return value


def superseded(
    spec: Spec | None, identities: Iterable[tuple[str, str, int]]
) -> set[tuple[str, str, int]]:
    """The search measurements a confirmation replaced: (backend, point key, 0) of a load
    measured again at repeat 1. They stay stored and in the search's path; the point's
    numbers (tables, charts, exports, compare's verdicts) are the confirmation's, as the
    search's verdict is, not a mean of a stall and what it hid. ``identities``: every
    (backend, point key, repeat) of a run's measurements."""
    if spec is None or spec.sla_search is None:
        return set()
    found = set(identities)
    return {
        (backend, key, 0)
        for backend, key, repeat in found
        if repeat == 1 and (backend, key, 0) in found and search_value(spec, key) is not None
    }


def without_superseded(
    spec: Spec | None, items: list[T], identity: Callable[[T], tuple[str, str, int]]
) -> list[T]:
    """``items`` (a run's measurements, any shape) less those a confirmation replaced
    (``superseded``); ``spec``: the run's spec, parsed (None: nothing is dropped)."""
    if spec is None or spec.sla_search is None:
        return items
    drop = superseded(spec, (identity(m) for m in items))
    return [m for m in items if identity(m) not in drop]


def steps_of(spec: Spec, backend: str, measurements: Iterable[Any]) -> list[Step]:
    """The search's steps on ``backend``, in the order they were measured.

    ``measurements``: result-document measurements (mappings or ``runners.result``
    objects) in the order they were recorded; other points and backends are skipped, and
    so is a repeat other than 0 or a confirmation (1) of a load that missed at 0.
    """
    search = spec.sla_search
    if search is None:
        return []
    steps = []
    for m in measurements:
        point = _get(m, "point")
        repeat = _get(m, "repeat") or 0
        if _get(m, "backend") != backend or repeat not in (0, 1):
            continue
        value = search_value(spec, str(_get(point, "key") or ""))
        if value is None:
            continue
        first = [s for s in steps if s.value == value]
        if (repeat == 0) != (not first) or (first and (first[0].passed or len(first) > 1)):
            continue  # a repeat the search would not have made
        status = str(_get(m, "status") or "")
        metrics = _get(m, "metrics") or {}
        passed, reason = judge(search, status, metrics)
        shown = {k: metrics.get(k) for k in search.slo}
        steps.append(Step(value, passed, str(_get(point, "key")), status, shown, reason, repeat))
    return steps


def _answer_text(search: SLASearch, value: float) -> str:
    load = _shown(value)
    where = f"{load} req/s" if search.axis == "request_rate" else f"concurrency {load}"
    return f"{where} at {search.describe_slo()}"


def result(
    spec: Spec, backend: str, steps: list[Step], ended: bool = False, gate: Gate | None = None
) -> dict[str, Any]:
    """The search on one backend as the result document carries it (see ``summarize``);
    ``ended``: the run is over, so a search that is not finished never will be; ``gate``:
    its configuration search gate (``gates``)."""
    search = spec.sla_search
    assert search is not None
    finished = next_value(search, steps, gate) is None
    verdict = verdicts(steps)
    fails = [v for v, ok in verdict.items() if not ok]
    lowest_fail = min(fails) if fails else None
    answer = _answer(steps)
    low, high = round_value(search, search.low), round_value(search, search.high)
    unit = UNITS[search.axis]
    if gate is not None and finished and dropped(steps, gate):
        state = "dropped"
        miss = [s for s in steps if s.value == gate.value][-1]
        where = _answer_text(search, gate.value).split(" at ")[0]
        text = (
            f"dropped: missed {search.describe_slo()} at {where} where {gate.leader} met it "
            f"({miss.reason})"
        )
    elif not steps and ended:
        state, text = "stopped", "not measured: the run ended before the search began"
    elif not steps:
        state, text = "pending", "not measured yet"
    elif answer is None and lowest_fail is not None and lowest_fail <= low and finished:
        state = "below range"
        where = f"{_shown(low)} req/s" if search.axis == "request_rate" else f"concurrency {low:g}"
        text = f"none: {search.describe_slo()} is not met even at {where}"
    elif not finished and ended:
        # The run ended mid-search (its server died, it was cancelled): what it learned,
        # said as a bound, never as an answer or as still running.
        state = "stopped"
        if answer is None:
            text = "none found: the run ended before the search met the SLO at any load"
        else:
            text = f"at least {_answer_text(search, answer)}"
        points = f"{len(steps)} point{'s' if len(steps) != 1 else ''}"
        text += f" (stopped after {points}; run it again for the answer)"
    elif answer is None:
        state, text = "running", "not determined yet"
    elif lowest_fail is None and answer >= high:
        state = "top of range"
        text = f"{_answer_text(search, answer)} (the top of the searched range: it may go higher)"
    elif finished and lowest_fail is None:  # the budget ran out below the high end
        state = "budget spent"
        text = f"{_answer_text(search, answer)} (not converged: the high end was not measured)"
    elif finished and _converged(search, answer, lowest_fail):
        state, text = "converged", _answer_text(search, answer)
    elif finished:
        state = "budget spent" if len(steps) >= search.max_points else "converged"
        text = _answer_text(search, answer)
        if state == "budget spent":
            text += f" (not converged: it fails at {_shown(lowest_fail or answer)})"
    else:
        state, text = "running", f"{_answer_text(search, answer)} so far"
    return {
        "backend": backend,
        "name": search.name,
        "axis": search.axis,
        "unit": unit,
        "slo": dict(search.slo),
        "answer": answer,
        "text": text,
        "state": state,
        "finished": finished,
        "bracket": [answer, lowest_fail],
        "points_used": len(steps),
        "max_points": search.max_points,
        "range": [low, high],
        "path": [asdict(s) for s in steps],
        "gate": asdict(gate) if gate else None,
    }


def summarize(spec: Spec, measurements: Iterable[Any], ended: bool = False) -> list[dict[str, Any]]:
    """Every SLA search of a run, one entry per searched backend (empty without one):

    ``answer`` (the load, or None), ``text`` ("12.5 req/s at p99 TTFT <= 500 ms"),
    ``state`` (converged, top of range, below range, budget spent, running, pending; and
    once the run has ended (``ended``), stopped for a search it left unfinished),
    ``finished``, ``bracket`` [highest passing, lowest failing], ``points_used`` of
    ``max_points``, ``path``: each step's load, verdict, point key and SLO metrics, and
    ``gate``: in a configuration search, the leader's answer it was measured at first
    (state ``dropped`` when it missed there).
    """
    if spec.sla_search is None:
        return []
    items = list(measurements)
    gated = gates(spec, items)
    return [
        result(spec, b.name, steps_of(spec, b.name, items), ended, gated.get(b.name))
        for b in spec.search_backends
    ]


def expected_measurements(spec: Spec, measurements: Iterable[Any]) -> int:
    """How many measurements a complete run of ``spec`` has, given what it measured: the
    spec's upper bound less the points a finished search did not need."""
    total = spec.total_measurements()
    search = spec.sla_search
    if search is None:
        return total
    items = list(measurements)
    gated = gates(spec, items)
    for backend in spec.search_backends:
        steps = steps_of(spec, backend.name, items)
        if next_value(search, steps, gated.get(backend.name)) is None:
            total -= search.max_points - len(steps)
    return total
