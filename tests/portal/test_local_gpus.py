"""How many GPUs the local executor offers (``preflight.local_gpus``) is the count a run
there records (``runners.environment.gpu_facts``): both read the machine's GPUs through
``runners.gpu_scope``. The machine is a recorded NVML session (two H200s, one with MIG
instances) replayed through pynvml's call names."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from portal.benchmarks import preflight
from runners import environment

_REPLAY = Path(__file__).resolve().parents[1] / "runners" / "nvmlreplay.py"
_spec = importlib.util.spec_from_file_location("nvmlreplay", _REPLAY)
assert _spec is not None and _spec.loader is not None
nvmlreplay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nvmlreplay)


def machine() -> dict[str, Any]:
    data = nvmlreplay.recording()
    data["cuda_driver_version"] = 12080
    data["devices"][1]["mig"] = [
        {"uuid": "MIG-0b6e2c1d-0001", "gpu_instance_id": 1, "compute_instance_id": 0}
    ]
    return data


@pytest.mark.parametrize(
    ("value", "offered"),
    [(None, 2), ("1", 1), ("1,7,0", 1), ("0,1", 2), ("-1", 0), ("0,0", 0), ("MIG-0b6e2c1d", 1)],
)
def test_the_local_executor_offers_the_gpus_a_run_records(
    value: str | None, offered: int, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.SERVEBENCH_LOCAL_GPUS = None
    if value is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert preflight.local_gpus(nvmlreplay.Replay(machine())) == offered
    assert environment.gpu_facts(nvmlreplay.Replay(machine()))["count"] == offered


def test_the_setting_wins_over_the_machine(settings: Any) -> None:
    settings.SERVEBENCH_LOCAL_GPUS = 0
    assert preflight.local_gpus(nvmlreplay.Replay(machine())) == 0


@pytest.mark.parametrize(("slots", "offered"), [(1, 8), (2, 4), (3, 2), (8, 1), (9, 0)])
def test_with_slots_a_run_is_offered_its_slots_share(
    slots: int, offered: int, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eight GPUs shared by ``slots`` concurrent runs: each gets the same whole number
    (runners.placement deals them out); more slots than GPUs offers none."""
    settings.SERVEBENCH_LOCAL_GPUS = None
    settings.SERVEBENCH_LOCAL_SLOTS = slots
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    eight = nvmlreplay.recording("nvml-8xh100-topology.json")
    assert preflight.local_gpus(nvmlreplay.Replay(eight)) == offered
