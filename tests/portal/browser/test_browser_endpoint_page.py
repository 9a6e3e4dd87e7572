"""An endpoint run's page (issue 29, item 3), in Chromium at 1280 and 390 px: the TTFT
budget box starts from the SLA search's own SLO, so the box and the search's answer speak
of one budget; the workload's own point (the spec has no sweep) gets no one-dot charts;
the environment says it is the runner's machine, without the model facts of a model it
never loaded."""

from __future__ import annotations

from typing import Any

import pytest
from test_browser_sla import SPEC, measured

from portal.benchmarks import environment, ingestion
from portal.benchmarks.models import Run
from runners import sla
from runners import spec as rs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)
SEARCH_SPEC = {**SPEC, "sla_search": {**SPEC["sla_search"], "slo": {"p99_ttft_ms": 300}}}


def _searched(make_run: Any, settings: Any) -> tuple[Run, dict[str, Any]]:
    settings.SERVEBENCH_ENDPOINT_HOSTS = ["*.svc.cluster.local"]
    run = make_run(spec=SEARCH_SPEC, status="running")
    spec = rs.parse_spec(run.spec)
    environment.store_environment(
        run,
        {
            # The runner's machine: it ran vLLM's bench client, never the model.
            "gpu": {"model": "none", "count": 0},
            "software": {"vllm": "0.32.0", "torch": "2.13.0", "python": "3.11.2"},
            "model": {"id": "org/tiny-model", "revision": "abc123", "revision_source": "hub"},
            "benchmark": {"dtype": "bfloat16", "max_model_len": 512, "input_len": 64},
            "endpoints": {
                "prod": {
                    "base_url": SPEC["backends"][0]["base_url"],
                    "served_model": "qwen3",
                    "api": "completions",
                    "engine": "vllm",
                    "version": "0.40.1",
                    "server_header": "uvicorn",
                    "metrics_exposed": True,
                    "request_fields": "openai",
                }
            },
        },
        "",
    )
    # The workload's own point (no sweep), then the search.
    ingestion.ingest_measurement(run, measured(spec, spec.points()[0], 90.0))
    steps: list[sla.Step] = []
    rows = []
    while (value := sla.next_value(spec.sla_search, steps)) is not None:
        ttft = 120.0 if value <= 16 else 900.0
        rows.append(measured(spec, rs.search_point(spec, value), ttft))
        ingestion.ingest_measurement(run, rows[-1])
        steps = sla.steps_of(spec, "prod", rows)
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    (answer,) = ingestion.sla_searches(Run.objects.get(pk=run.pk))
    return run, answer


def test_an_endpoint_run_page_speaks_of_one_budget_and_the_runners_machine(
    page: Any, make_user: Any, make_run: Any, settings: Any
) -> None:
    run, answer = _searched(make_run, settings)
    Run.objects.filter(pk=run.pk).update(is_public=True)
    assert "p99 TTFT <= 300 ms" in answer["text"]
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto(run.get_absolute_url())
        page.wait_for("document.getElementById('sla-answer-1')")
        # One budget: the box starts from the search's SLO, and finds what the search found.
        assert page.page.input_value("#budget-ms") == "300"
        assert "the SLA search's SLO" in page.page.inner_text("#budget-source")
        assert "no point within budget" not in page.page.inner_text("#budget-result")
        # The workload's own point: numbers in the table, no chart of one dot.
        ids = page.page.eval_on_selector_all(
            "[data-figure-id]", "els => els.map(e => e.dataset.figureId)"
        )
        assert ids and not [i for i in ids if i.startswith("single-")]
        assert "One point per backend here, so no curves" in page.page.inner_text("#live")
        # The environment is the runner's machine's; the endpoint's are under Endpoints.
        env = page.page.locator("#environment + .panel dl.kv")
        text = env.inner_text()
        assert "the endpoint reports its own engine" in page.page.inner_text("#environment-note")
        assert "vLLM (the runner's bench client)" in text
        for absent in ("dtype", "Model revision", "abc123", "Max model length"):
            assert absent not in text
        assert "0.40.1" in page.page.inner_text("#endpoint-facts")
        page.assert_fits()
        page.shot(f"run-endpoint-{width}")
    assert page.console_errors == []
