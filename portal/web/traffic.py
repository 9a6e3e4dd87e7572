"""The run page's section on production traffic (``_run_traffic.html``): for each point
a trace or sessions drove (``runners.traffic``), how faithfully the load was sent (the
client's send lag, and whether it kept up), the prefix cache, each turn of the sessions,
and the answers checked under that load. One query (the run's measurements whose ``raw``
carries ``traffic``) for a run whose spec has a trace or sessions, none per row.
"""

from __future__ import annotations

from typing import Any

from portal.benchmarks.models import Measurement, Run
from runners import spec as rs

MAX_ROWS = 24


def _row(backend: str, point_key: str, repeat: int, raw: dict[str, Any]) -> dict[str, Any]:
    facts = raw.get("traffic") if isinstance(raw.get("traffic"), dict) else {}
    lag = facts.get("lag") if isinstance(facts.get("lag"), dict) else {}
    trace = facts.get("trace") if isinstance(facts.get("trace"), dict) else {}
    checked = facts.get("correctness") if isinstance(facts.get("correctness"), dict) else {}
    turns = facts.get("per_turn") if isinstance(facts.get("per_turn"), list) else []
    return {
        "backend": backend,
        "point": f"{point_key} (repeat {repeat})" if repeat else point_key,
        "mode": facts.get("mode", ""),
        "requests": trace.get("replayed") if trace else raw.get("num_prompts"),
        "sessions": facts.get("sessions"),
        "lag_p50": lag.get("p50_ms"),
        "lag_p99": lag.get("p99_ms"),
        "lag_max": lag.get("max_ms"),
        "kept_up": lag.get("kept_up"),
        "lag_note": lag.get("note", ""),
        "hit_rate": facts.get("prefix_cache_hit_rate"),
        "clipped": trace.get("clipped_to_context") or 0,
        "agreement": (checked.get("metrics") or {}).get("greedy_agreement"),
        "eval": (checked.get("metrics") or {}).get("eval_accuracy"),
        "turns": [t for t in turns if isinstance(t, dict)],
    }


def section(run: Run, spec: rs.Spec | None) -> dict[str, Any] | None:
    """The section's rows, or None when no point of the run was driven by traffic (no
    query at all for a run whose spec has neither a trace nor sessions)."""
    if spec is None or (spec.workload.trace is None and spec.workload.sessions is None):
        return None
    rows = (
        Measurement.objects.filter(run=run, raw__has_key="traffic")
        .order_by("id")
        .values_list("backend", "point_key", "repeat", "raw")
    )
    out = [_row(b, k, r, raw) for b, k, r, raw in rows[:MAX_ROWS] if isinstance(raw, dict)]
    if not out:
        return None
    return {"rows": out, "late": [r for r in out if r["kept_up"] is False]}
