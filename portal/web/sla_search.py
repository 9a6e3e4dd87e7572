"""The run page's section on SLA searches and endpoint backends (``_sla_search.html``).

One presenter for one partial, kept apart from the page's other presenters: the answer
and path of each SLA search (``runners.sla`` through ``ingestion.sla_searches``, the same
numbers the result document, the API and the CLI give), what each endpoint said about
itself (the environment's ``endpoints``), and a note wherever an endpoint's output
lengths could not be forced (``raw["servebench"]``, ``runners.vllm_bench.request_facts``).
Two queries, none per row (the run is loaded once: ``runview``).
"""

from __future__ import annotations

from typing import Any

from portal.benchmarks.models import Measurement, Run
from portal.benchmarks.runview import LoadedRun
from runners import spec as rs

MAX_NOTES = 12
_AXIS_LABELS = {"request_rate": "request rate (req/s)", "max_concurrency": "concurrency"}
_STATE_CLASS = {
    "converged": "ok",
    "top of range": "ok",
    "below range": "bad",
    "budget spent": "warn",
    "stopped": "warn",
    "dropped": "warn",
}


def _search_view(search: dict[str, Any]) -> dict[str, Any]:
    keys = list(search["slo"])
    return {
        "backend": search["backend"],
        "text": search["text"],
        "state": search["state"],
        "css": _STATE_CLASS.get(search["state"], ""),
        "points_used": search["points_used"],
        "max_points": search["max_points"],
        "axis_label": _AXIS_LABELS.get(search["axis"], search["axis"]),
        "limits": [
            {"label": rs.slo_text(k, v).split(" <=")[0], "limit": f"{v:g}"}
            for k, v in search["slo"].items()
        ],
        "path": [
            {
                "value": step["value"],
                "passed": step["passed"],
                "values": [step["metrics"].get(k) for k in keys],
                "reason": step["reason"],
                "point_key": step["point_key"],
                "again": step.get("repeat", 0) == 1,
            }
            for step in search["path"]
        ],
    }


def _endpoint_notes(run: Run) -> list[str]:
    rows = Measurement.objects.filter(run=run, backend_kind="endpoint").order_by("id")
    notes = []
    for backend, point_key, repeat, raw in rows.values_list(
        "backend", "point_key", "repeat", "raw"
    ):
        facts = (raw or {}).get("servebench") if isinstance(raw, dict) else None
        if isinstance(facts, dict) and facts.get("output_len") == "not forced":
            where = f"{point_key} (repeat {repeat})" if repeat else point_key
            notes.append(
                f"{backend} {where}: {facts.get('short_responses', '?')} of "
                f"{facts.get('responses', '?')} responses ended before "
                f"{facts.get('requested_output_len', '?')} tokens"
            )
    if len(notes) > MAX_NOTES:
        notes = [*notes[:MAX_NOTES], f"and {len(notes) - MAX_NOTES} more points"]
    return notes


def _endpoints(view: LoadedRun) -> list[dict[str, Any]]:
    found = view.snapshot.get("endpoints")
    if not isinstance(found, dict):
        return []
    out = []
    for name, facts in found.items():
        if not isinstance(facts, dict):
            continue
        out.append(
            {
                "name": name,
                "base_url": facts.get("base_url", "unknown"),
                "served_model": facts.get("served_model", "unknown"),
                "api": facts.get("api", "unknown"),
                "engine": facts.get("engine", "unknown"),
                "version": facts.get("version", "unknown"),
                "server": facts.get("server_header", "unknown"),
                "metrics": facts.get("metrics_exposed", "unknown"),
                "request_fields": facts.get("request_fields", "vllm"),
            }
        )
    return out


def section(view: LoadedRun) -> dict[str, Any] | None:
    """What ``_sla_search.html`` shows for the run, or None when it has neither an SLA
    search nor an endpoint backend."""
    spec, run = view.spec, view.run
    if spec is None or (spec.sla_search is None and not spec.endpoint_backends):
        return None
    searches = view.sla_searches
    endpoints = _endpoints(view) if spec.endpoint_backends else []
    notes = _endpoint_notes(run) if spec.endpoint_backends else []
    return {
        "searches": [_search_view(s) for s in searches],
        "endpoints": endpoints,
        "notes": notes,
    }
