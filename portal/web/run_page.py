"""Everything the run page shows, gathered in a fixed number of queries, and for a
finished run computed once (``portal.web.pagecache``).

The page has two parts:

- ``results_part(run, manager)``: everything derived from the run's measurements,
  environment and spec: results, headline, contention, capacity, charts, the summary
  table, the environment, the reproduce commands, and the rendered HTML of the heavy
  sections (``FRAGMENTS``). The same for every reader, except error texts, which only
  who manages the run reads in full (``manager``). A finished run cannot change, so
  what this part renders is kept for it (``KEPT``), keyed by its ``updated_at``.
- per request: who may act on it, the failure reason for this reader, the queue, the
  runner's log tail, and re-runs (which other runs create).

Queries of the results part, whatever the number of points or repeats: the measurements
(one; one more for per-request arrays when an SLO's goodput must be computed), the
conditions of those the runner measured under CPU contention (one), the environment,
the reproduce commands, the per-request samples of the points measured once (their
request-level intervals; ``points.attach_request_intervals``). Per request: the re-runs
of this run, and for a re-run its original and the compare verdict against it
(``reproduce.verdict``: the compare page's queries). The runner's log tail comes from
the executor (a file for the local one, the Kubernetes API for Jobs), for the owner and
staff only.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.template.loader import render_to_string

from portal.benchmarks import baselines, capacity, goodput, queries, reproduce, runview, sharing
from portal.benchmarks import points as pts
from portal.benchmarks.models import Run, RunStatus
from portal.benchmarks.queue import queue_info
from portal.dispatch import runlog
from portal.web import (
    figures,
    pagecache,
    presenters,
    ranking,
    sla_search,
    tables,
    telemetry,
    traffic,
)
from portal.web.figures.common import AXIS_SHORT
from runners import envfacts
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
            "running_batch": p.get("num_requests_running_mean"),
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
    return [
        {"series": s, "best": goodput.best_point(s.points)}
        for s in results.series()
        if s.axis in pts.LOAD_AXES
    ]


def budget_summary(results: pts.RunResults, budget_ms: float | None) -> list[str]:
    """Per load sweep and backend, the most output tok/s with p99 TTFT within budget, as
    the budget box says it (run.js says the same when the reader types a budget)."""
    if not budget_ms:
        return []
    out = []
    for s in results.series():
        if s.axis not in pts.LOAD_AXES:
            continue
        best = pts.best_within_budget(pts.load_points(s), budget_ms)
        who = f"{s.backend} {s.sweep}"
        if best is None:
            out.append(f"{who}: no point within budget")
        else:
            x, latency, throughput = best
            short = AXIS_SHORT.get(s.axis, s.axis)
            out.append(
                f"{who}: {throughput:.1f} tok/s at {short}={pts.number(x)} ({latency:.0f} ms)"
            )
    return out


def rerun_context(user: AbstractBaseUser | AnonymousUser, run: Run) -> dict[str, Any]:
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


def related_compare(run: Run, rerun_info: dict[str, Any]) -> tuple[list[Run], Run]:
    """The runs the page's "Compare with the original / its re-runs" link selects, in its
    order (this run first), and its reference (the original); one run: no link."""
    related = [rerun_info.get("original"), *rerun_info["reruns"]]
    return [run, *(r for r in related if r is not None)], rerun_info.get("original") or run


def history_point(results: pts.RunResults) -> pts.PointStats | None:
    """The point the history link opens: the best vLLM output tok/s."""
    vllm = [p for p in results.points if p.backend_kind == "vllm" and p.ok and p.axis]
    return max(vllm, key=lambda p: p.get("output_throughput") or 0.0, default=None)


def _on_cpu(snapshot: dict[str, Any]) -> bool:
    gpu = snapshot.get("gpu") if isinstance(snapshot.get("gpu"), dict) else {}
    return bool(gpu) and (gpu.get("count") in (0, "0") or str(gpu.get("model")) == "none")


# The heavy sections, rendered once per results part: name -> template.
FRAGMENTS = {
    "headline": "web/_run_headline.html",
    "sla_search": "web/_run_sla_search.html",
    "ranking": "web/_run_ranking.html",
    "traffic": "web/_run_traffic.html",
    "charts": "web/_run_charts.html",
    "capacity": "web/_run_capacity.html",
    "summary": "web/_run_summary.html",
    "environment": "web/_run_environment.html",
    "reproduce": "web/_run_reproduce.html",
    "telemetry": "web/_telemetry.html",
}


def results_part(run: Run, manager: bool, reference: str | None = None) -> dict[str, Any]:
    """What the page derives from the run's data (module docstring), with its heavy
    sections rendered (``fragments``). The run is loaded once (``runview.load``).
    ``reference``: the backend the reader chose to compare with (``?reference=``)."""
    view = runview.load(run)
    results = view.results
    assert results is not None
    results.chosen_reference = reference
    reference_query = urlencode({"reference": reference}) if reference else ""
    pts.attach_request_intervals(results)  # the headline's and the table's noise
    headline = presenters.summary(results)
    for point in results.points:  # runner text: one line each for who does not manage it
        point.errors = [sharing.error_for(manager, e) for e in point.errors]
    environment = view.environment
    snapshot = view.snapshot  # scrubbed of credentials when stored (ingestion)
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
    if plan is not None:  # decode-bound points cite the roofline (an estimate)
        concurrency = next((s for s in results.series() if s.axis == "max_concurrency"), None)
        pts.attach_roofline(concurrency, plan.roofline)
    budget = pts.default_ttft_budget(results, view.spec)
    budget_ms = budget[0] if budget else None
    headings = tables.summary_headings(results)
    charts = figures.run_figures(
        results, plan, _gpu_memory_bytes(snapshot), budget_ms, on_cpu=_on_cpu(snapshot)
    )
    part: dict[str, Any] = {
        "results": results,
        "reference_query": reference_query,
        "figures": charts.items,
        "chart_groups": charts.by_sweep(),
        "has_pareto": any(f["kind"] == "pareto" for f in charts.items),
        "summary": headline,
        "contention": presenters.contention(run, results, headline),
        # Which cores the servers and the load generator had (runners.placement).
        "core_split": str(envfacts.lookup(snapshot, "host.core_split") or ""),
        "metric_columns": headings,
        "extra_columns": sum(h.extra for h in headings),
        "summary_rows": tables.summary_rows(results, headings),
        "capacity": plan,
        "slo": results.slo,
        "slo_text": presenters.slo_text(results.slo) if results.slo else "",
        "slo_best": slo_summary(results),
        "budget_ms": budget_ms,
        "budget_source": budget[1] if budget else "",
        "budget_best": budget_summary(results, budget_ms),
        "preempted": [p for p in results.points if (p.get("preemptions") or 0) > 0],
        "has_environment": environment is not None,
        "env_facts": presenters.environment_facts(snapshot, view.spec),
        "env_note": presenters.environment_note(view.spec),
        "snapshot": snapshot,
        "reproduce": presenters.reproduce_commands(view, snapshot),
        "spec_yaml": rs.dump_spec(view.spec) if view.spec is not None else "",
        "sla_section": sla_search.section(view),
        "ranking": ranking.section(view),  # issue 26: portal/web/ranking.py
        "traffic": traffic.section(run, view.spec),  # trace replay and sessions (runners.traffic)
        "history_point": history_point(results),
    }
    if part["ranking"] and part["ranking"]["chart"]:  # drawn from the page's figure list
        part["figures"] = [*part["figures"], part["ranking"]["chart"]]
    part["telemetry"] = telemetry.page_part(run, results)  # issue 15: portal/web/telemetry.py
    # A run with nothing measured offers nothing to download or re-check, and loads no
    # chart library (run.js loads it when a live run's first charts arrive).
    part["has_results"] = any(p.ok for p in results.points)
    part["loads_charts"] = bool(part["figures"]) or bool(part["telemetry"]["points"])
    context = {**part, "run": run}
    part["fragments"] = {name: render_to_string(t, context) for name, t in FRAGMENTS.items()}
    return part


def _slot(run: Run, manager: bool, reference: str | None = None) -> pagecache.Slot | None:
    if not run.is_final:
        return None
    identity: tuple[Any, ...] = (run.public_id, manager)
    if reference is not None:  # None: the default page (the one run_page.warm fills)
        identity += (reference,)
    return pagecache.slot("run", identity, (run.updated_at,), run.pk)


def warm(run: Run) -> dict[str, Any]:
    """Build the finished ``run``'s page parts into the pages cache, as its managers and
    as everyone else see them, so the first reader of the page is served warm; the
    managers' part is returned. Called when the runner reports the end, where the cache
    is shared (``pagecache.shared``): a per-process cache would warm only the web process
    that took the report."""
    if not run.is_final:
        raise ValueError(f"run {run.short_id} is {run.status}: only a finished page is kept")
    parts = {
        manager: pagecache.get_or_build(
            _slot(run, manager), lambda m=manager: kept(results_part(run, m))
        )
        for manager in (True, False)
    }
    return parts[True]


def run_labels(run: Run) -> list[str]:
    """The run's labels: read with the run (``queries.get_visible_run``), else one query."""
    found = getattr(run, "label_list", None)
    if found is not None:
        return queries.sorted_labels(found)
    return baselines.labels_of([run.pk]).get(run.pk, [])


def reference_param(run: Run, value: str | None) -> str | None:
    """The ``?reference=`` a reader gave, when it names one of the run's backends (else
    None: the default reference, and one cached page however the URL was spelt)."""
    if not value:
        return None
    names = {b.get("name") or b.get("kind") for b in (run.spec or {}).get("backends") or []}
    return value if value in names else None


# What the page's template and view read of the results part, besides its rendered
# sections: the part kept in the pages cache and in Postgres is these alone. The objects
# behind them (results, tables, figures: ~110 kB pickled, ~0.7 ms to unpickle on every
# warm request, where these take ~0.1 ms) are in a page's context only when its request
# built it.
KEPT = ("fragments", "summary", "contention", "has_results", "loads_charts", "history_point")


def kept(part: dict[str, Any]) -> dict[str, Any]:
    """The part of ``results_part`` a finished page keeps (``KEPT``)."""
    return {name: part[name] for name in KEPT}


def build(
    user: AbstractBaseUser | AnonymousUser, run: Run, reference: str | None = None
) -> dict[str, Any]:
    """The run page's context (without request-specific URLs); ``reference`` as
    ``reference_param`` reads it. The objects behind the results part are in it when
    this request computed them (an unfinished run's page, or a finished one's first)."""
    manager = queries.may_manage(user, run)
    reference = reference_param(run, reference)
    fresh: dict[str, Any] = {}

    def compute() -> dict[str, Any]:
        fresh.update(results_part(run, manager, reference))
        return kept(fresh)

    part = pagecache.get_or_build(_slot(run, manager, reference), compute)
    rerun_info = rerun_context(user, run)
    ordered, reference_run = related_compare(run, rerun_info)
    return {
        **fresh,
        **part,
        "run": run,
        "compare_ids": [r.public_id for r in ordered],
        "compare_baseline": reference_run.public_id,
        "can_manage": sharing.can_share(user, run),
        "can_cancel": manager and not run.is_final,
        "failure_reason": sharing.failure_reason_for(user, run),
        "queue": queue_info(run),
        "labels": run_labels(run),
        "log_tail": log_tail(user, run),
        **rerun_info,
    }
