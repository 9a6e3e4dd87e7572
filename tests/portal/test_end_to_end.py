"""The whole stack: API submit -> real Celery worker -> local executor -> real runner on the
tiny model (HF sequential baseline and a vLLM server with vLLM's bench client) ->
measurements through the live server -> run succeeded -> API and run page show the numbers.

Minutes on a CPU (the vLLM server alone takes ~100 s to start on 2 cores).
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from portal.benchmarks.models import Measurement, Run, RunStatus
from runners.result import ResultDocument

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(1200),
]


def e2e_spec(model: str) -> dict:
    return {
        "name": "end-to-end on the tiny model",
        "model": {"id": model, "max_model_len": 2048},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 16, "num_warmups": 1},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1, 4]}],
        "backends": [
            {"kind": "hf-sequential", "num_prompts": 4, "num_warmups": 0},
            {"kind": "vllm"},
        ],
        "resources": {"gpu_count": 0, "timeout_minutes": 20},
    }


def test_submit_run_and_read_the_numbers(
    personas, tiny_model, have_vllm, live_server, celery_worker, waiter
):
    worker = celery_worker(public_url=live_server.url, beat=True, reconcile_seconds=5)
    owner = personas["owner"]
    response = owner.client.post(
        "/api/v1/runs/",
        json.dumps({"spec": e2e_spec(str(tiny_model))}),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    public_id = response.json()["id"]
    assert response.json()["progress"] == {"done": 0, "total": 3}

    def ended():
        run = Run.objects.get(public_id=public_id)
        return run if run.is_final else None

    run = waiter(ended, 1100, "the run to end", interval=2)
    log = f"worker log:\n{worker.output()[-4000:]}\nrunner log:\n{_runner_log(run)}"
    assert run.status == RunStatus.SUCCEEDED, f"{run.failure_reason}\n{log}"

    rows = {(m.backend, m.point_key): m for m in Measurement.objects.filter(run=run)}
    assert set(rows) == {
        ("hf-sequential", "baseline"),
        ("vllm", "concurrency:max_concurrency=1"),
        ("vllm", "concurrency:max_concurrency=4"),
    }
    for m in rows.values():
        assert m.status == "succeeded", m.error
        assert m.output_throughput > 0 and m.mean_ttft_ms > 0 and m.p99_e2el_ms > 0
    c1 = rows[("vllm", "concurrency:max_concurrency=1")]
    c4 = rows[("vllm", "concurrency:max_concurrency=4")]
    assert (c1.concurrency, c4.concurrency) == (1, 4)
    assert c4.kv_cache_usage_peak is not None  # read from the server's /metrics

    # The API returns the numbers, to the owner only.
    detail = owner.client.get(f"/api/v1/runs/{public_id}/").json()
    assert detail["status"] == "succeeded"
    assert detail["progress"] == {"done": 3, "total": 3}
    served = {
        (m["backend"], m["point_key"]): m["output_throughput"] for m in detail["measurements"]
    }
    assert served == {k: m.output_throughput for k, m in rows.items()}
    assert detail["environment"]["vllm_version"]
    doc = ResultDocument.model_validate(owner.client.get(f"/api/v1/runs/{public_id}/result").json())
    assert doc.status == "succeeded" and len(doc.measurements) == 3
    assert doc.measurements[0].detail  # per-request arrays made it through
    for who in ("other", "anon"):
        assert personas[who].client.get(f"/api/v1/runs/{public_id}/").status_code == 404

    # The run page (portal.web) shows them too.
    browser = Client()
    browser.force_login(owner.user)
    page = browser.get(f"/runs/{public_id}/")
    assert page.status_code == 200
    html = page.content.decode()
    for m in rows.values():
        assert f"{m.output_throughput:.1f}" in html


def _runner_log(run: Run) -> str:
    from pathlib import Path

    handle = run.executor_handle or {}
    path = Path(handle.get("workdir", "/nonexistent")) / "runner.log"
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no log)"
