"""The run page's time series per point and its energy block, drawn in headless Chromium
(issue 15): a real tiny-model vLLM point's /metrics series with its requests marked, the
GPUs' power and utilisation where NVML was read, "not measured (no NVML)" where not."""

from __future__ import annotations

from typing import Any

import pytest
from energydata import cpu_point, hf_body, ingest, point_spec, with_gpus

from portal.benchmarks import runview
from portal.benchmarks.models import Run
from portal.web import telemetry as web_telemetry

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DRAWN = """
() => ['server', 'gpu'].map(kind => {
  const el = document.getElementById('telemetry-' + kind);
  return {
    hidden: el.hidden,
    traces: el.data ? el.data.map(t => [t.name, (t.x || []).length]) : null,
    range: el.layout ? el.layout.xaxis.range : null,
    svg: el.querySelectorAll('.main-svg').length,
  };
})
"""


def finished(run: Any) -> Any:
    Run.objects.filter(pk=run.pk).update(status="succeeded", is_public=True)
    run.refresh_from_db()
    return run


def expected(run: Any, point_id: str) -> dict[str, Any]:
    part = web_telemetry.page_part(run, runview.load(run).results)
    return next(p for p in part["points"] if p["id"] == point_id)


def traces(figure: dict[str, Any] | None) -> list[list[Any]] | None:
    if figure is None:
        return None
    return [[t["name"], len(t["x"])] for t in figure["data"]]


def test_the_run_page_draws_a_points_series_and_its_energy(
    page: Any, make_run: Any, spec_dict: Any, measurement: Any, settings: Any
) -> None:
    settings.SERVEBENCH_GPU_HOUR_PRICES = {"H200": 3.6}
    run = make_run(spec=point_spec(spec_dict), status="running")
    body = with_gpus(cpu_point())
    vllm = ingest(run, body)
    hf = ingest(run, hf_body(measurement, body["telemetry"]))
    run = finished(run)
    page.goto(run.get_absolute_url())
    page.wait_for("document.getElementById('telemetry-gpu').data")
    assert page.page.input_value("#telemetry-point") == f"m{vllm.pk}"
    server, gpu = page.page.evaluate(DRAWN)
    want = expected(run, f"m{vllm.pk}")
    assert server["traces"] == traces(want["server"]) and server["svg"] > 0
    assert ["Request sent", 48] in server["traces"]
    assert ["Requests running", len(body["telemetry"]["server"]["t"])] in server["traces"]
    assert gpu["traces"] == traces(want["gpu"]) and not gpu["hidden"]
    # Opened on the requests' window (zoom out or reset to see the client start before it).
    window = body["telemetry"]["window"]
    assert server["range"][0] < 0 < window[1] - window[0] < server["range"][1]
    assert "fewer joules per output token than the HF loop" in page.page.inner_text(
        "#energy-headline"
    )
    assert page.page.inner_text("#energy-table").count("\n") >= 2
    page.shot("run-telemetry-gpu")
    # The HF baseline has no /metrics: its server chart goes, its GPUs stay.
    page.page.select_option("#telemetry-point", f"m{hf.pk}")
    page.wait_for("document.getElementById('telemetry-server').hidden")
    server, gpu = page.page.evaluate(DRAWN)
    assert server["hidden"] and gpu["traces"] == traces(expected(run, f"m{hf.pk}")["gpu"])
    assert page.console_errors == []


def test_without_nvml_the_page_says_so_and_draws_the_server(
    page: Any, make_run: Any, spec_dict: Any
) -> None:
    run = make_run(spec=point_spec(spec_dict), status="running")
    vllm = ingest(run, cpu_point())
    run = finished(run)
    page.goto(run.get_absolute_url())
    page.wait_for("document.getElementById('telemetry-server').data")
    server, gpu = page.page.evaluate(DRAWN)
    assert server["traces"] == traces(expected(run, f"m{vllm.pk}")["server"])
    assert gpu["hidden"] and gpu["traces"] is None
    note = page.page.inner_text("#energy-not-measured")
    assert "not measured (no NVML): NVML did not initialise" in note
    assert "GPUs: not measured (no NVML)" in page.page.inner_text("#telemetry-note")
    page.shot("run-telemetry-cpu")
    assert page.console_errors == []
