"""Measurements with the conditions the runner records (``runners.conditions``), stored
through the real services, for the contention tests of the API, the run page and the
browser."""

from __future__ import annotations

import random
from typing import Any

import webdata

from portal.benchmarks import environment, ingestion, intake
from portal.benchmarks.models import Run, RunStatus
from runners import result as rr

REASON = (
    "other processes used 0.92 CPUs of the 2 cores it owned (46% of their time); "
    "the busiest other processes: cc1plus 7.10 s"
)


def conditions(contended: bool) -> dict[str, Any]:
    """Shaped as runners.conditions.Watch writes them (recorded on a 2-core machine)."""
    return {
        "cores": "0-1",
        "core_count": 2,
        "cores_source": "affinity",
        "cpu_quota": None,
        "host_cpus": 2,
        "wall_s": 15.4,
        "process_cpu_s": 14.9 if contended else 29.6,
        "process_cpu_per_wall": 0.97 if contended else 1.92,
        "threads": 2,
        "threads_source": "cores",
        "others_cpu_s": 14.2 if contended else 0.1,
        "others_share": 0.461 if contended else 0.003,
        "steal_share": 0.002,
        "top_others": [{"pid": 4242, "name": "cc1plus", "cpu_s": 7.1}] if contended else [],
        "throttled_s": 0.0,
        "load_avg": {"start": [3.1, 2.5, 2.0], "end": [3.4, 2.6, 2.1]},
        "contended": contended,
        "reasons": [REASON] if contended else [],
    }


def run_with(
    owner: Any,
    *,
    hf_contended: bool,
    vllm_contended_at: int | None = None,
    core_split: str | None = None,
) -> Run:
    """A finished run through the real services: an HF baseline and a concurrency sweep,
    each measurement carrying its conditions (and the environment ``core_split``)."""
    spec = webdata.sweep_spec([1, 4, 16])
    run = intake.create_run(owner, spec, "conditions")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    snapshot = webdata.snapshot()
    if core_split is not None:
        snapshot["host"]["core_split"] = core_split
    environment.store_environment(run, snapshot, "f" * 64)
    run.refresh_from_db()
    hf = webdata.hf_measurement(40.0).model_copy(update={"conditions": conditions(hf_contended)})
    ingestion.ingest_measurement(run, hf)
    rng, base = random.Random(1), webdata.recording()
    for c in (1, 4, 16):
        data = webdata.scaled_point(base, c, rng, 2000.0)
        m = webdata.vllm_measurement("concurrency", "max_concurrency", c, data)
        m = m.model_copy(update={"conditions": conditions(c == vllm_contended_at)})
        ingestion.ingest_measurement(run, m)
    ingestion.ingest_event(run, rr.Event(type="finished", status="succeeded", errors=[]))
    run.refresh_from_db()
    return run
