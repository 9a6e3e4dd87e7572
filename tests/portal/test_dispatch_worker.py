"""A real Celery worker (and beat) against the real broker, dispatching the real runner.

The runner runs the HF sequential baseline on the tiny model (seconds on a CPU) and
reports to the live test server; the vLLM half is in tests/cli/test_cli_real_runs.py
(slow: its real runs take the same path with a vLLM server).
"""

from __future__ import annotations

import json
import signal
import time

import psutil
import pytest
from localruns import runner_process_of

from portal.benchmarks.models import Measurement, Run, RunStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

RUNS = "/api/v1/runs/"


def hf_spec(model: str, num_prompts: int = 4, output_len: int = 16) -> dict:
    return {
        "name": "hf on the tiny model",
        "model": {"id": model, "max_model_len": 2048},
        "workload": {"input_len": 64, "output_len": output_len, "num_prompts": 4, "num_warmups": 0},
        "backends": [{"kind": "hf-sequential", "num_prompts": num_prompts, "num_warmups": 0}],
        "resources": {"gpu_count": 0, "timeout_minutes": 10},
    }


def submit(client, spec: dict) -> str:
    response = client.post(RUNS, json.dumps({"spec": spec}), content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def run_of(public_id: str) -> Run:
    return Run.objects.get(public_id=public_id)


def runner_process(run: Run) -> psutil.Process:
    """The runner itself: the child of the supervisor the executor started."""
    return runner_process_of(run.executor_handle)


def test_api_submit_is_dispatched_by_a_worker_and_the_runner_reports_back(
    personas, tiny_model, live_server, celery_worker, waiter
):
    worker = celery_worker(public_url=live_server.url)
    public_id = submit(personas["owner"].client, hf_spec(str(tiny_model)))

    def finished():
        run = run_of(public_id)
        return run if run.is_final else None

    run = waiter(finished, 180, f"the run to finish; worker log:\n{worker.output()[-3000:]}")
    assert run.status == RunStatus.SUCCEEDED, (run.failure_reason, worker.output()[-3000:])
    assert run.executor == "local" and run.started_at and run.finished_at
    assert "servebench.dispatch" in worker.output()
    measurement = Measurement.objects.get(run=run)
    assert measurement.backend_kind == "hf-sequential"
    assert measurement.output_throughput > 0 and measurement.p99_ttft_ms > 0
    assert run.environment.gpu_name == "CPU"
    assert run.environment.torch_version.startswith("2.")

    body = personas["owner"].client.get(f"{RUNS}{public_id}/").json()
    assert body["status"] == "succeeded"
    assert body["progress"] == {"done": 1, "total": 1}
    assert body["measurements"][0]["output_throughput"] == measurement.output_throughput
    for who in ("other", "anon"):
        assert personas[who].client.get(f"{RUNS}{public_id}/").status_code == 404


def test_cancel_through_the_api_stops_the_runner(
    personas, tiny_model, live_server, celery_worker, waiter
):
    celery_worker(public_url=live_server.url)
    # Long enough to still be running when cancelled.
    public_id = submit(personas["owner"].client, hf_spec(str(tiny_model), 2000, 256))
    run = waiter(
        lambda: (r := run_of(public_id)).status == RunStatus.RUNNING and r,
        120,
        "the runner to report started",
    )
    runner = runner_process(run)
    assert personas["other"].client.post(f"{RUNS}{public_id}/cancel").status_code == 404
    assert personas["anon"].client.post(f"{RUNS}{public_id}/cancel").status_code == 401
    response = personas["owner"].client.post(f"{RUNS}{public_id}/cancel")
    assert response.status_code == 202
    waiter(lambda: not runner.is_running() or runner.status() == "zombie", 60, "the runner to stop")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.failure_reason == "cancelled by owner"


def test_a_killed_runner_fails_within_one_reconcile_period(
    personas, tiny_model, live_server, celery_worker, waiter
):
    period = 3
    celery_worker(public_url=live_server.url, beat=True, reconcile_seconds=period)
    public_id = submit(personas["owner"].client, hf_spec(str(tiny_model), 2000, 256))
    run = waiter(
        lambda: (r := run_of(public_id)).status == RunStatus.RUNNING and r,
        120,
        "the runner to report started",
    )
    runner_process(run).send_signal(signal.SIGKILL)  # the OOM killer, say
    killed_at = time.monotonic()
    run = waiter(lambda: (r := run_of(public_id)).is_final and r, 60, "reconcile")
    elapsed = time.monotonic() - killed_at
    assert run.status == RunStatus.FAILED
    assert run.failure_reason.startswith(
        "runner exited with code 137 (SIGKILL) without reporting a result; last lines of its log:"
    )
    # A reconcile tick found it (one period, plus the time the supervisor takes to reap
    # the child and the beat tick and the worker take to get to it: seconds more on a
    # loaded 2-core machine, where a tick that waits too long expires and the next one
    # does it), not the 60 s re-dispatch sweep or a runner deadline.
    assert elapsed < 30, f"reconcile took {elapsed:.1f} s with a {period} s period"


def test_a_measurement_the_portal_cannot_store_fails_the_run(
    personas, tiny_model, live_server, celery_worker, waiter, settings
):
    # The portal refuses the HF measurement (413: above the measurement size limit). The
    # runner keeps it in its result file, and the run fails saying so, never "succeeded".
    settings.SERVEBENCH_MAX_MEASUREMENT_BYTES = 2_000
    celery_worker(public_url=live_server.url)
    public_id = submit(personas["owner"].client, hf_spec(str(tiny_model)))
    run = waiter(lambda: (r := run_of(public_id)).is_final and r, 180, "the run to end")
    assert run.status == RunStatus.FAILED, run.failure_reason
    assert run.failure_reason.startswith("the portal could not store 1 measurement(s)")
    assert "413" in run.failure_reason and "result file" in run.failure_reason
    assert not Measurement.objects.filter(run=run).exists()
