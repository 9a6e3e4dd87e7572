"""Concurrent runs on a multi-GPU host own disjoint GPUs and cores.

The real dispatcher (``fill_slots``, PostgreSQL, its advisory lock) claims queued runs
into the local executor's slots, and the real executor and supervisor start a stand-in
runner for each, which writes down the environment it was given. The host is described
(``tests/runners/data/nvml-8xh100-topology.json``: eight H100s, two sockets of 56 cores
with two threads each, read through NVML's call names), since this machine has no GPU.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from portal.benchmarks import intake
from portal.benchmarks.models import Run, RunStatus
from portal.dispatch import dispatcher
from portal.dispatch.executors import ExecutorState
from portal.dispatch.executors.local import LocalExecutor
from runners import nvml, placement
from runners.conditions import parse_cpu_list

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

_REPLAY = Path(__file__).resolve().parents[1] / "runners" / "nvmlreplay.py"
_spec = importlib.util.spec_from_file_location("nvmlreplay", _REPLAY)
assert _spec is not None and _spec.loader is not None
nvmlreplay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nvmlreplay)

STAND_IN = """#!{python}
import json, os, sys
from pathlib import Path
keep = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "SERVEBENCH_CPUS")
seen = {{k: os.environ[k] for k in keep if k in os.environ}}
Path(sys.argv[4]).with_name("seen.json").write_text(json.dumps(seen))
"""


def eight_gpu_host() -> placement.Host:
    data = nvmlreplay.recording("nvml-8xh100-topology.json")
    gpus, near = nvml.read_topology(nvmlreplay.Replay(data))
    described = placement.Host.from_dict(data)
    return placement.Host(tuple(gpus), near, described.cpus, described.siblings)


def spec(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"id": "org/tiny-model", "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 4},
        "backends": [{"kind": "vllm"}],
        "resources": {"gpu_count": 0, "timeout_minutes": 10},
    }


@pytest.fixture
def stand_in(tmp_path: Path) -> str:
    path = tmp_path / "stand-in"
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def seen(executor: LocalExecutor, run: Run) -> dict[str, str]:
    """What the stand-in was given, once its supervisor has exited."""
    handle = Run.objects.get(pk=run.pk).executor_handle
    deadline = time.monotonic() + 120
    while executor.status(handle).state in (ExecutorState.PENDING, ExecutorState.RUNNING):
        assert time.monotonic() < deadline, executor.logs(handle)
        time.sleep(0.1)
    path = Path(handle["workdir"]) / "seen.json"
    assert path.exists(), executor.logs(handle)
    return json.loads(path.read_text())


def test_two_slots_get_disjoint_gpus_and_the_cores_nearest_them(
    make_user, settings, tmp_path: Path, stand_in: str
) -> None:
    settings.SERVEBENCH_EXECUTOR = "local"
    user = make_user("owner")
    with transaction.atomic():
        runs = [intake.create_run(user, spec(f"run {i}")) for i in range(3)]
    executor = LocalExecutor(
        python=stand_in, data_dir=tmp_path / "data", slots=2, host=eight_gpu_host()
    )
    outcomes = dispatcher.fill_slots(executor)
    first, second, third = runs
    assert outcomes[first.pk] == outcomes[second.pk] == "submitted"
    assert outcomes.get("waiting") == "1" and third.pk not in outcomes

    a, b = seen(executor, first), seen(executor, second)
    uuids = [d["uuid"] for d in nvmlreplay.recording("nvml-8xh100-topology.json")["devices"]]
    assert a["CUDA_VISIBLE_DEVICES"].split(",") == uuids[:4]  # socket 0's GPUs
    assert b["CUDA_VISIBLE_DEVICES"].split(",") == uuids[4:]  # socket 1's
    assert set(parse_cpu_list(a["SERVEBENCH_CPUS"])) == set(parse_cpu_list("0-55,112-167"))
    assert set(parse_cpu_list(b["SERVEBENCH_CPUS"])) == set(parse_cpu_list("56-111,168-223"))
    handles = [Run.objects.get(pk=r.pk).executor_handle for r in (first, second)]
    assert [h["slot"] for h in handles] == [0, 1]
    log = executor.logs(handles[1])
    assert f"[servebench] slot 1: GPUs {b['CUDA_VISIBLE_DEVICES']}, cores 56-111,168-223" in log

    # The first run ends: its slot (and only its hardware) goes to the next run.
    Run.objects.filter(pk=first.pk).update(status=RunStatus.SUCCEEDED)
    outcomes = dispatcher.fill_slots(executor)
    assert outcomes[third.pk] == "submitted"
    assert Run.objects.get(pk=third.pk).executor_handle["slot"] == 0
    assert seen(executor, third) == a


def test_more_slots_than_gpus_fails_the_run_with_what_to_change(
    make_user, settings, tmp_path: Path, stand_in: str
) -> None:
    settings.SERVEBENCH_EXECUTOR = "local"
    with transaction.atomic():
        run = intake.create_run(make_user("owner"), spec("too many slots"))
    executor = LocalExecutor(
        python=stand_in, data_dir=tmp_path / "data", slots=9, host=eight_gpu_host()
    )
    assert dispatcher.fill_slots(executor)[run.pk] == "failed"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "SERVEBENCH_LOCAL_SLOTS=9, but this worker sees 8 GPUs" in run.failure_reason
    assert "Set SERVEBENCH_LOCAL_SLOTS to at most 8" in run.failure_reason
