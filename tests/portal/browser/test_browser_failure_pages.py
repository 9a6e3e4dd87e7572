"""Failure pages (issue 29, item 2), in Chromium at 1280 and 390 px: a run whose model
path does not exist says so (not "context too long", though its log prints max_model_len);
an empty log is said to be empty; a run that measured nothing offers no Re-run and no
result download, and loads no chart library; a queued run neither."""

from __future__ import annotations

from typing import Any

import pytest

from portal.benchmarks import ingestion
from portal.benchmarks.models import RunStatus
from runners import result as rr

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)

# What the runner reports when vLLM cannot find a local model directory: the server's
# arguments (max_model_len among them) come before the error in the quoted log.
NO_DIR_ERROR = (
    "vLLM server exited with code 1 before it was ready. Last lines of its log "
    "(/work/run/vllm.log):\n"
    "(APIServer pid=7) INFO 11-30 13:55:54 [api_utils.py:286] non-default args: "
    "{'model': '/models/gone', 'max_model_len': 512}\n"
    "Traceback (most recent call last):\n"
    "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
    "'/models/gone'. Use `repo_type` argument if needed.\n"
)
EMPTY_LOG_ERROR = (
    "the HF baseline exited with code 1. Its log (/work/run/hf.log) is empty: it failed "
    "before writing anything."
)


def _no_results_offers(page: Any) -> None:
    assert page.page.locator("#rerun").count() == 0
    assert page.page.locator("#download-result, #download-csv, #download-json").count() == 0
    assert page.page.locator("script[src*=plotly]").count() == 0
    assert page.page.evaluate("typeof window.Plotly") == "undefined"


def test_a_failed_run_names_its_cause_and_offers_only_what_exists(
    page: Any, make_user: Any, make_run: Any, measurement: Any
) -> None:
    user = make_user("fay")
    run = make_run(owner=user, status=RunStatus.RUNNING, progress_total=2)
    failures = (
        ("vllm", "concurrency:max_concurrency=1", NO_DIR_ERROR),
        ("hf-sequential", "baseline", EMPTY_LOG_ERROR),
    )
    for backend, point_key, error in failures:
        body = measurement(backend=backend, point_key=point_key, status="failed", error=error)
        ingestion.ingest_measurement(run, rr.Measurement.model_validate(body))
    ingestion.ingest_event(run, rr.Event(type="finished", status="partial", errors=[]))
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    page.sign_in(user.username, "pw-fay")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto(run.get_absolute_url())
        notice = page.page.inner_text("#failure-reason")
        assert "Next: the model's path does not exist" in notice
        assert "context" not in notice
        assert "Last lines of its log:" not in notice
        _no_results_offers(page)
        # What there is to do instead: open the spec in the form, fix it, submit again.
        assert page.page.locator("#edit-resubmit").is_visible()
        page.assert_fits()
        page.shot(f"run-failed-nothing-measured-{width}")
    page.page.click("#edit-resubmit")
    page.page.wait_for_load_state()
    assert "/runs/new/" in page.page.url
    assert page.page.input_value("#id_model_id") == run.model_id
    assert page.console_errors == []


def test_a_queued_run_offers_no_rerun_download_or_charts(
    page: Any, make_user: Any, make_run: Any
) -> None:
    user = make_user("quinn")
    run = make_run(owner=user)  # queued
    page.sign_in(user.username, "pw-quinn")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto(run.get_absolute_url())
        assert page.page.inner_text("#run-status") == "Queued"
        _no_results_offers(page)
        assert page.page.locator("#edit-resubmit").count() == 0
        page.assert_fits()
        page.shot(f"run-queued-{width}")
    assert page.console_errors == []


def test_a_queued_page_draws_the_charts_when_its_results_arrive(page: Any, make_user: Any) -> None:
    # Opened while queued (no chart library loaded), left open while the run runs: the
    # live page loads the library when the first charts arrive and draws them.
    import random

    import webdata

    from portal.benchmarks import environment, intake
    from portal.benchmarks.models import Run

    user = make_user("ada")
    run = intake.create_run(user, webdata.sweep_spec([1, 4]), "late charts")
    page.sign_in(user.username, "pw-ada")
    page.page.set_viewport_size({"width": 390, "height": 900})
    page.goto(run.get_absolute_url())
    assert page.page.evaluate("typeof window.Plotly") == "undefined"
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    environment.store_environment(run, webdata.snapshot(), "f" * 64)
    ingestion.ingest_measurement(run, webdata.hf_measurement(40.0))
    rng, base = random.Random(1), webdata.recording()
    for c in (1, 4):
        data = webdata.scaled_point(base, c, rng, 2000.0)
        ingestion.ingest_measurement(
            run, webdata.vllm_measurement("concurrency", "max_concurrency", c, data)
        )
    ingestion.ingest_event(run, rr.Event(type="finished", status="succeeded", errors=[]))
    page.wait_for("document.querySelector('#chart-concurrency-output .main-svg')", 30_000)
    assert page.page.evaluate("typeof window.Plotly") == "object"
    page.shot("run-live-charts-arrive-390")
    assert page.console_errors == []
