"""The run page's SLA search and endpoint section in headless Chromium: the answer, the
path that led there, what the endpoint said about itself, and the warning when an
endpoint's output lengths could not be forced."""

from __future__ import annotations

from typing import Any

import pytest
import webdata
from test_browser_layout import check

from portal.benchmarks import environment, ingestion
from portal.benchmarks.models import Run
from runners import result as rr
from runners import sla
from runners import spec as rs
from runners.vllm_bench import point_info

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SPEC = webdata.SEARCH_SPEC


def measured(spec: rs.Spec, point: rs.Point, p99_ttft: float, repeat: int = 0) -> rr.Measurement:
    return rr.Measurement(
        backend="prod",
        backend_kind="endpoint",
        point=point_info(point),
        repeat=repeat,
        status="succeeded",
        metrics={"output_throughput": 40.0 * (point.request_rate or 1), "p99_ttft_ms": p99_ttft},
        raw={
            "servebench": {
                "output_len": "not forced",
                "requested_output_len": 16,
                "short_responses": 2,
                "responses": 16,
            }
        },
        started_at="2026-11-30T06:00:00.000+00:00",
        finished_at="2026-11-30T06:00:05.000+00:00",
        duration_s=5.0,
    )


def searching(make_run: Any, settings: Any) -> tuple[Run, rs.Spec]:
    """A running endpoint run with an SLA search, its environment and sweep point stored."""
    settings.SERVEBENCH_ENDPOINT_HOSTS = ["*.svc.cluster.local"]
    run = make_run(spec=SPEC, status="running")
    spec = rs.parse_spec(run.spec)
    environment.store_environment(
        run,
        {
            "gpu": {"model": "none", "count": 0},
            "endpoints": {
                "prod": {
                    "base_url": SPEC["backends"][0]["base_url"],
                    "served_model": "qwen3",
                    "api": "completions",
                    "engine": "vllm",
                    "version": "0.32.0",
                    "server_header": "uvicorn",
                    "metrics_exposed": True,
                    "request_fields": "openai",
                }
            },
        },
        "",
    )
    ingestion.ingest_measurement(run, measured(spec, spec.points()[0], 90.0))
    return run, spec


def test_the_run_page_shows_the_sla_answer_and_its_path(page: Any, make_run: Any, settings: Any):
    run, spec = searching(make_run, settings)
    steps: list[sla.Step] = []
    rows: list[rr.Measurement] = []
    while (value := sla.next_value(spec.sla_search, steps)) is not None:
        repeat = sla.next_repeat(steps, value)
        ttft = 3100.0 if (value, repeat) == (1, 0) else 150.0 if value <= 12 else 2e3  # a stall
        rows.append(measured(spec, rs.search_point(spec, value), ttft, repeat))
        ingestion.ingest_measurement(run, rows[-1])
        steps = sla.steps_of(spec, "prod", rows)
    Run.objects.filter(pk=run.pk).update(status="succeeded", is_public=True)
    (answer,) = ingestion.sla_searches(run)

    page.goto(run.get_absolute_url())
    page.wait_for("document.getElementById('sla-answer-1')")
    assert page.page.inner_text("#sla-answer-1").startswith(answer["text"])
    rows_shown = page.page.locator("#sla-path-1 tbody tr")
    assert rows_shown.count() == len(steps)
    # The low end stalled once and was measured again; then the high end.
    assert "missed" in rows_shown.nth(0).inner_text()
    assert rows_shown.nth(1).inner_text().split("\t")[:2] == ["2 again", "1"]
    assert rows_shown.nth(2).inner_text().split("\t")[:2] == ["3", "64"]
    assert "missed" in rows_shown.nth(2).inner_text()
    assert page.page.is_visible("#output-length-note")
    assert "0.32.0" in page.page.inner_text("#endpoint-facts")
    page.page.locator("#sla-search-section").scroll_into_view_if_needed()
    page.shot("run-sla-search")
    assert page.console_errors == []
    # At a desktop's and a phone's width: nothing overflows, charts drawn, screenshots.
    check(page, "run-sla-search", run.get_absolute_url(), charts=True)


def test_a_search_the_run_left_unfinished_reads_as_stopped(page: Any, make_run: Any, settings: Any):
    """The endpoint died at the high end: the failed run's page says what the search
    learned (at least 1 req/s) and that it stopped, at a desktop's and a phone's width."""
    run, spec = searching(make_run, settings)
    ingestion.ingest_measurement(run, measured(spec, rs.search_point(spec, 1), 150.0))
    died = measured(spec, rs.search_point(spec, 64), 0.0).model_copy(
        update={"status": "failed", "metrics": {}, "error": "the endpoint stopped answering"}
    )
    ingestion.ingest_measurement(run, died)
    ingestion.ingest_event(run, rr.Event(type="failed", message="the endpoint stopped answering"))
    Run.objects.filter(pk=run.pk).update(is_public=True)
    (search,) = ingestion.sla_searches(Run.objects.get(pk=run.pk))
    assert search["state"] == "stopped"

    page.goto(run.get_absolute_url())
    page.wait_for("document.getElementById('sla-answer-1')")
    shown = page.page.inner_text("#sla-answer-1")
    assert shown.startswith("at least 1 req/s at p99 TTFT <= 500 ms (stopped after 2 points")
    assert "· stopped, 2 of at most 8 points" in shown and "so far" not in shown
    assert "notice warn" in page.page.inner_html("#sla-search-section")
    page.page.locator("#sla-search-section").scroll_into_view_if_needed()
    page.shot("run-sla-search-stopped")
    check(page, "run-sla-search-stopped", run.get_absolute_url(), charts=True)
