"""The pages in a real headless Chromium: sign in, submit, live progress, charts."""

from __future__ import annotations

from typing import Any

import pytest
import webdata

from portal.benchmarks import ingestion
from portal.benchmarks.models import Run, RunStatus
from runners import result as rr

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def user_with_password(make_user: Any, name: str = "carol") -> tuple[Any, str]:
    user = make_user(name)
    return user, "pw-" + name  # the factory's password


def test_sign_in_then_submit_shows_errors_at_the_field_then_queues(
    page: Any, make_user: Any, settings: Any
) -> None:
    settings.SERVEBENCH_LOCAL_GPUS = 1  # the seed asks for a GPU (preflight refuses it without)
    user, password = user_with_password(make_user)
    page.sign_in(user.username, password)
    page.goto("/runs/new/")
    page.page.fill("#id_model_id", "org/model;rm -rf /")
    page.page.click("#run-form button[type=submit]")
    error = page.page.locator("#model_id-errors")
    assert "not allowed" in error.inner_text()
    assert page.page.locator("[data-field=model_id].has-error").count() == 1
    page.shot("run-new-error")
    assert Run.objects.count() == 0

    page.page.fill("#id_model_id", "Qwen/Qwen3-0.6B")
    page.page.fill("#id_concurrency", "1, 8")
    page.page.click("#run-form button[type=submit]")
    page.page.wait_for_url("**/runs/*/")
    run = Run.objects.get()
    assert page.page.url.endswith(run.get_absolute_url())
    assert page.page.locator("#run-status").inner_text() == "Queued"
    assert run.spec["sweeps"][0]["values"] == [1, 8]
    assert page.console_errors == []


def test_choosing_a_preset_fills_the_spec_box(page: Any, make_user: Any) -> None:
    user, password = user_with_password(make_user)
    page.sign_in(user.username, password)
    page.goto("/runs/new/")
    page.page.fill("#id_spec_text", "")
    page.page.select_option("#id_preset", "seed")
    assert "Qwen/Qwen3-0.6B" in page.page.input_value("#id_spec_text")


def test_the_run_page_shows_progress_live_then_the_charts(
    page: Any, make_run: Any, make_user: Any, spec_dict: Any
) -> None:
    user, password = user_with_password(make_user)
    sweeps = [{"name": "concurrency", "axis": "max_concurrency", "values": [4, 8]}]
    workload = {"input_len": 128, "output_len": 32, "num_prompts": 32, "num_warmups": 0}
    spec = spec_dict(sweeps=sweeps, workload=workload, model={"id": "org/tiny-model"})
    run = make_run(owner=user, spec=spec, status=RunStatus.RUNNING)
    page.sign_in(user.username, password)
    page.goto(run.get_absolute_url())
    assert page.page.locator("#run-status").inner_text() == "Running"
    page.page.evaluate("window.__sameDocument = true")

    ingestion.ingest_measurement(run, webdata.hf_measurement(45.0))
    ingestion.ingest_event(run, rr.Event(type="progress", done=1, total=3))
    page.wait_for("document.getElementById('run-done').textContent === '1'")
    page.page.wait_for_selector("#summary-table")
    page.shot("run-live-progress")

    for value, recording in ((4, webdata.RECORDED_C4), (8, webdata.RECORDED_C8)):
        data = webdata.recording(recording)
        ingestion.ingest_measurement(
            run, webdata.vllm_measurement("concurrency", "max_concurrency", value, data)
        )
    ingestion.ingest_event(run, rr.Event(type="progress", done=3, total=3))
    ingestion.ingest_event(run, rr.Event(type="finished", status="succeeded", errors=[]))
    page.wait_for("document.getElementById('run-status').textContent.trim() === 'Succeeded'")
    chart = "document.getElementById('chart-concurrency-output')"
    page.wait_for(f"{chart} && {chart}.data && {chart}.data.length === 2")
    # No reload happened: the page updated itself.
    assert page.page.evaluate("window.__sameDocument") is True
    traces = page.page.evaluate(f"{chart}.data.map(t => ({{name: t.name, n: t.x.length}}))")
    assert traces == [
        {"name": "vllm", "n": 2},
        {"name": "hf-sequential (baseline, 128 in / 32 out)", "n": 2},
    ]
    for chart_id in ("concurrency-ttft", "concurrency-tpot"):
        n = page.page.evaluate(f"document.getElementById('chart-{chart_id}').data.length")
        assert n == 2  # p50 and p99: this client recorded no p90
    assert page.page.locator("#summary-table tbody tr").count() == 3
    page.shot("run-finished")
    assert page.console_errors == []


def test_a_private_run_is_not_shown_to_anonymous_visitors(page: Any, make_run: Any) -> None:
    run = make_run()
    response = page.goto(run.get_absolute_url())
    assert response.status == 404
    assert "private" in page.page.locator("main").inner_text()
    page.console_errors.clear()  # the browser logs the 404 itself
    Run.objects.filter(pk=run.pk).update(is_public=True)
    response = page.goto(run.get_absolute_url())
    assert response.status == 200
    assert page.console_errors == []
