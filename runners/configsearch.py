"""A configuration search's budget and each configuration's outcome.

The spec (``runners.spec.configsearch``) turns one vLLM backend into several
configurations, measured one after another, each on its own server. Two things decide how
far a search goes:

- early dropping (``runners.sla.gates``): with an SLA search, a configuration after the
  first is measured first at the leader's answer; missing the SLO there (confirmed as the
  search's ``confirm`` says) drops it: it cannot beat the leader;
- the budget (``config_search.budget``): before each configuration starts, the points the
  configurations have measured and the minutes since the first one began are compared with
  the budget; once either is spent the remaining configurations are not started ("not
  measured (budget)"). A configuration that has started always finishes, so each one that
  was measured has a complete answer.

The runner records the configurations it did not start, and why, in the result
document's timings (``NOT_MEASURED``), which reach the portal with the run's last event;
everything else here is a pure function of the spec and the measurements, so the runner,
the portal and the CLI say the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from runners.spec import Spec

# timings[TIMINGS_KEY][NOT_MEASURED]: {configuration name: why it was not started}.
TIMINGS_KEY = "config_search"
NOT_MEASURED = "not_measured"


def _get(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def budget_reason(spec: Spec, measurements: Iterable[Any], elapsed_s: float) -> str | None:
    """Why the next configuration may not start (None: it may): the budget's points or
    minutes are spent. ``elapsed_s``: seconds since the first configuration began."""
    search = spec.config_search
    if search is None or search.budget is None:
        return None
    budget = search.budget
    names = set(spec.config_names)
    used = sum(1 for m in measurements if _get(m, "backend") in names)
    if budget.points is not None and used >= budget.points:
        return f"the budget of {budget.points} points was spent ({used} measured)"
    if budget.minutes is not None and elapsed_s >= budget.minutes * 60:
        return (
            f"the budget of {budget.minutes:g} minutes was spent ({elapsed_s / 60:.1f} minutes in)"
        )
    return None


def planned_measurements(spec: Spec, name: str) -> int:
    """How many measurements configuration ``name`` would report at most: its sweep
    points and repeats, and its SLA search's points when it is searched."""
    count = len(spec.points()) * spec.repeats
    search = spec.sla_search
    if search is not None and name in {b.name for b in spec.search_backends}:
        count += search.max_points
    return count


def skipped_of(timings: Mapping[str, Any] | None) -> dict[str, str]:
    """The configurations a run did not start and why, from its timings."""
    section = (timings or {}).get(TIMINGS_KEY) or {}
    found = section.get(NOT_MEASURED) if isinstance(section, Mapping) else None
    return {str(k): str(v) for k, v in (found or {}).items()} if isinstance(found, Mapping) else {}


def outcomes(
    spec: Spec,
    measurements: Iterable[Any],
    searches: list[dict[str, Any]],
    skipped: Mapping[str, str] | None = None,
    ended: bool = False,
) -> list[dict[str, Any]]:
    """Each configuration of the search, in order: ``name``, ``overrides`` (what it sets),
    ``state`` (measured, dropped, not measured, running, pending) and ``reason`` (why it
    was dropped or not measured, or its search's answer). ``searches``: the run's SLA
    search summaries (``runners.sla.summarize``); ``skipped``: ``skipped_of(timings)``."""
    if spec.config_search is None:
        return []
    skipped = skipped or {}
    by_backend = {s["backend"]: s for s in searches}
    seen: dict[str, list[str]] = {}
    for m in measurements:
        seen.setdefault(str(_get(m, "backend")), []).append(str(_get(m, "status")))
    out = []
    overrides = spec.config_search.overrides()
    for name, sets in zip(spec.config_names, overrides, strict=True):
        sets = {k: v for k, v in sets.items() if k != "name"}
        search = by_backend.get(name)
        statuses = seen.get(name, [])
        if name in skipped:
            state, reason = "not measured", skipped[name]
        elif search is not None and search["state"] == "dropped":
            state, reason = "dropped", search["text"]
        elif not statuses:
            state = "not measured" if ended else "pending"
            reason = "the run ended before it began" if ended else "not measured yet"
        elif search is not None and not search["finished"] and not ended:
            state, reason = "running", search["text"]
        elif search is not None:
            state, reason = "measured", search["text"]
        elif "succeeded" not in statuses:
            state, reason = "measured", "every point failed"
        else:
            state, reason = "measured", f"{len(statuses)} measurements"
        out.append({"name": name, "overrides": sets, "state": state, "reason": reason})
    return out
