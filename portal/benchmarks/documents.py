"""A run's result document, rebuilt from what the portal stored: the same shape as the
runner's ``--out`` file (``runners.result.ResultDocument``), so the CLI, the API and the
offline compare read one format.

- ``result_document(run)``: the whole document (3 queries, plus the samples storage; a
  run with several served configurations is loaded once more for its ranking).
- ``measurement_document(row, detail, telemetry)``: one stored measurement as
  ``runners.result.Measurement`` JSON.
- ``document_status(run)``: the document's status for the run's.

Who may see which parts (credentials, private runs) is ``sharing.document_for``'s.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from portal.benchmarks import ranking, runview, samples
from portal.benchmarks.ingestion import config_outcomes, sla_searches
from portal.benchmarks.models import Environment, Measurement, Run, RunStatus
from runners import result as rr


def _iso(value: datetime | None) -> str:
    return value.isoformat(timespec="milliseconds") if value else ""


def measurement_document(
    row: Measurement,
    detail: dict[str, Any] | None = None,
    telemetry: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A stored measurement as ``runners.result.Measurement`` JSON; ``detail``: its
    per-request arrays as ``samples.details`` read them (default: the row's own column);
    ``telemetry``: its time series as ``samples.telemetry`` reads them (default: none)."""
    return {
        "backend": row.backend,
        "backend_kind": row.backend_kind,
        "point": {
            "key": row.point_key,
            "sweep": row.sweep,
            "axis": row.axis or None,
            "value": row.value,
            "input_len": row.input_len,
            "output_len": row.output_len,
            "max_concurrency": row.concurrency,
            "num_prompts": row.num_prompts,
            "request_rate": row.request_rate,
        },
        "repeat": row.repeat,
        "status": row.status,
        "error": row.error or None,
        "metrics": row.metrics,
        "server_metrics": row.server_metrics,
        "gpu_memory_peak_bytes": row.gpu_memory_peak_bytes,
        "commands": row.commands,
        "raw": row.raw,
        "detail": row.detail if detail is None else detail,
        "samples_full": row.samples_full or None,
        "conditions": row.conditions or {},
        "telemetry": telemetry or {},
        "started_at": _iso(row.started_at),
        "finished_at": _iso(row.finished_at),
        "duration_s": row.duration_s or 0.0,
    }


def document_status(run: Run) -> str:
    """The result document's status: running until the run ends; partial if the runner
    said so; a cancelled run reads failed."""
    if run.status == RunStatus.SUCCEEDED:
        return "succeeded"
    if run.status in (RunStatus.QUEUED, RunStatus.DISPATCHED, RunStatus.RUNNING):
        return "running"
    return "partial" if run.outcome == "partial" else "failed"


def result_document(run: Run) -> dict[str, Any]:
    """The run's result document (same shape as the runner's ``--out`` file): 3 queries,
    and two reads of the samples storage (samples, telemetry) per measurement that has
    samples there; then the SLA searches, the configuration outcomes and the ranking of
    its served configurations (``ranking.rank``: the run loaded once more)."""
    environment = Environment.objects.filter(run=run).first()
    rows = list(Measurement.objects.filter(run=run).order_by("id"))
    arrays = samples.details(rows)
    series = samples.telemetry(rows)
    errors = list(run.errors or [])
    if run.failure_reason and run.outcome != "partial":
        errors.append({"where": "portal", "message": run.failure_reason})
    timings = dict(run.timings or {})
    timings.setdefault("created_at", _iso(run.created_at))
    if run.started_at:
        timings.setdefault("started_at", _iso(run.started_at))
    if run.finished_at:
        timings.setdefault("finished_at", _iso(run.finished_at))
    searches = sla_searches(run)
    outcomes = config_outcomes(run, searches=searches)
    kinds = [b.get("kind") for b in (run.spec or {}).get("backends") or [] if isinstance(b, dict)]
    served = sum(1 for k in kinds if k in ranking.SERVED_KINDS)
    ranked = ranking.rank(runview.load(run), searches, outcomes) if served >= 2 else None
    return {
        "schema_version": rr.RESULT_SCHEMA_VERSION,
        "runner_version": run.runner_version or "",
        "status": document_status(run),
        "spec": run.spec,
        "environment": environment.snapshot if environment else {},
        "fingerprint": environment.fingerprint if environment and environment.fingerprint else None,
        "measurements": [
            measurement_document(row, arrays.get(row.pk), series.get(row.pk)) for row in rows
        ],
        "errors": errors,
        "timings": timings,
        "sla_searches": searches,
        "config_search": outcomes,
        "ranking": ranked.as_dict() if ranked else None,
    }
