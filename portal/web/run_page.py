"""Everything the run page shows, gathered in a fixed number of queries.

Queries, whatever the number of points or repeats: the measurements (one; one more for
per-request arrays when an SLO's goodput must be computed), the conditions of those the
runner measured under CPU contention (one), the environment, the
reproduce commands, the re-runs of this run, the per-request samples of the points
measured once (their request-level intervals; ``points.attach_request_intervals``), and
for a re-run its original and the compare verdict against it (``reproduce.verdict``: the
compare page's queries). The runner's log tail comes from the executor (a file for the
local one, the Kubernetes API for Jobs), for the owner and staff only.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from portal.benchmarks import capacity, goodput, queries, reproduce, sharing
from portal.benchmarks import points as pts
from portal.benchmarks.models import Run, RunStatus
from portal.benchmarks.queue import queue_info
from portal.dispatch import runlog
from portal.web import figures, presenters, tables
from portal.web.figures.run import LOAD_AXES, PARETO_LATENCY, best_within_budget, slo_text
from runners import spec as rs

log = logging.getLogger(__name__)

LOG_TAIL_LINES = 200
LOG_STATUSES = (RunStatus.DISPATCHED, RunStatus.RUNNING, RunStatus.FAILED, RunStatus.CANCELLED)


def log_tail(user: AbstractBaseUser | AnonymousUser, run: Run) -> runlog.LogTail | None:
    """The last LOG_TAIL_LINES lines of the runner's output (``runlog.log_tail``, as the
    logs endpoint), while the run is active and after it failed or was cancelled; None
    for who may not read it and for runs that never reached an executor."""
    if run.status not in LOG_STATUSES or not run.executor or not run.executor_handle:
        return None
    return runlog.log_tail(user, run, LOG_TAIL_LINES)


def capacity_curve(results: pts.RunResults) -> list[dict[str, Any]]:
    """The first vLLM concurrency sweep's points, as capacity.plan wants them."""
    series = next((s for s in results.series() if s.axis == "max_concurrency"), None)
    if series is None:
        return []
    return [
        {
            "x": p.x,
            "concurrency": p.concurrency,
            "num_prompts": p.num_prompts,
            "input_len": p.input_len,
            "output_len": p.output_len,
            "output_throughput": p.get("output_throughput"),
            "preemptions": p.get("preemptions"),
            "mean_tpot_ms": p.get("mean_tpot_ms"),
        }
        for p in series.points
    ]


def _gpu_memory_bytes(snapshot: dict[str, Any]) -> float | None:
    gpu = snapshot.get("gpu") if isinstance(snapshot.get("gpu"), dict) else {}
    mib, count = gpu.get("memory_total_mib"), gpu.get("count")
    if isinstance(mib, int | float) and isinstance(count, int) and count > 0:
        return float(mib) * 2**20 * count
    return None


def slo_summary(results: pts.RunResults) -> list[dict[str, Any]]:
    """Per load sweep and backend: the point with the best goodput under the SLO."""
    if not results.slo:
        return []
    out = []
    for s in results.series():
        if s.axis not in LOAD_AXES:
            continue
        best = goodput.best_point(s.points)
        out.append({"series": s, "best": best})
    return out


def budget_summary(results: pts.RunResults, budget_ms: float | None) -> list[dict[str, Any]]:
    """Per load sweep and backend: the most output tok/s with p99 TTFT within budget."""
    if not budget_ms:
        return []
    out = []
    for s in results.series():
        if s.axis not in LOAD_AXES:
            continue
        points = [
            (p.x, p.get(PARETO_LATENCY), p.get("output_throughput"))
            for p in s.points
            if p.get(PARETO_LATENCY) is not None and p.get("output_throughput") is not None
        ]
        out.append({"series": s, "best": best_within_budget(points, budget_ms)})
    return out


def rerun_context(
    user: AbstractBaseUser | AnonymousUser, run: Run, results: pts.RunResults
) -> dict[str, Any]:
    """The original of a re-run with the reproduction verdict, and this run's re-runs."""
    out: dict[str, Any] = {"reruns": reproduce.reruns_of(user, run)}
    original = reproduce.original_of(user, run)
    if original is not None:
        out["original"] = original
        out["verdict"] = reproduce.verdict(user, original, run)
        out["verdict_checks"] = reproduce.shown_checks(out["verdict"])
    elif reproduce.original_id(run):
        out["original_hidden"] = True
    return out


def history_point(results: pts.RunResults) -> pts.PointStats | None:
    """The point the history link opens: the best vLLM output tok/s."""
    vllm = [p for p in results.points if p.backend_kind == "vllm" and p.ok and p.axis]
    return max(vllm, key=lambda p: p.get("output_throughput") or 0.0, default=None)


def build(user: AbstractBaseUser | AnonymousUser, run: Run) -> dict[str, Any]:
    """The run page's context (without request-specific URLs)."""
    results = pts.run_results(run)
    pts.attach_request_intervals(results)  # the headline's and the table's noise
    headline = presenters.summary(results)
    manager = queries.may_manage(user, run)
    for point in results.points:  # runner text: one line each for who does not manage it
        point.errors = [sharing.error_for(manager, e) for e in point.errors]
    environment = presenters.environment_of(run)
    # Credentials never show, whoever reads (stored snapshots from before ingestion
    # scrubbed them included).
    snapshot = sharing.scrub_value(environment.snapshot) if environment else {}
    plan = (
        None
        if environment is None
        else capacity.plan(
            run.spec,
            snapshot,
            capacity_curve(results),
            reported=results.server_metrics,
            gpu_name=run.gpu_name,
        )
    )
    budget = (results.slo or {}).get("ttft_ms")
    metric_columns = tables.columns(results)
    preempted = [p for p in results.points if (p.get("preemptions") or 0) > 0]
    charts = figures.run_figures(results, plan, _gpu_memory_bytes(snapshot), budget)
    rerun_info = rerun_context(user, run, results)
    related = [rerun_info.get("original"), *rerun_info["reruns"]]
    compare_ids = [run.public_id, *(r.public_id for r in related if r is not None)]
    return {
        "results": results,
        "figures": charts,
        "has_pareto": any(f["kind"] == "pareto" for f in charts),
        "compare_ids": compare_ids,
        "compare_baseline": (rerun_info.get("original") or run).public_id,
        "summary": headline,
        "contention": presenters.contention(run, results, headline),
        "metric_columns": metric_columns,
        "summary_rows": tables.summary_rows(results, metric_columns),
        "capacity": plan,
        "slo": results.slo,
        "slo_text": slo_text(results.slo) if results.slo else "",
        "slo_best": slo_summary(results),
        "budget_ms": budget,
        "budget_best": budget_summary(results, budget),
        "preempted": preempted,
        "environment": environment,
        "env_facts": presenters.environment_facts(snapshot),
        "snapshot": snapshot,
        "reproduce": presenters.reproduce_commands(run, snapshot),
        "spec_yaml": rs.dump_spec(rs.parse_spec(run.spec)),
        "can_manage": sharing.can_share(user, run),
        "can_cancel": queries.may_manage(user, run) and not run.is_final,
        "failure_reason": sharing.failure_reason_for(user, run),
        "queue": queue_info(run),
        "log_tail": log_tail(user, run),
        "history_point": history_point(results),
        **rerun_info,
    }
