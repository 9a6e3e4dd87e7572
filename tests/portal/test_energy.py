"""Energy and cost per point (issue 15): priced at ingestion, stored with the metrics and the
time series beside the samples, shown on the run page, in compare and in the CLI's
verdict; "not measured (no NVML)" where a run had no GPU telemetry.

Data: a real tiny-model vLLM point measured on this project's CPU machines (its /metrics
series, request times, no NVML: ``data/tiny-vllm-c8-point.json``), and for the GPU case
the same point with the replayed synthetic two-GPU NVML session laid over its requests
(``tests/runners/data``): the NVML path is unverified on hardware.
"""

from __future__ import annotations

from typing import Any

import pytest
from energydata import COST, J_PER_TOKEN, cpu_point, hf_body, ingest, point_spec, with_gpus

from portal.benchmarks import documents, energy, runview, samples
from portal.benchmarks.compare import compare
from portal.web import telemetry as web_telemetry
from runners import result as rr
from servebench.compare import compare_documents
from servebench.verdict import NO_DATA, parse_metric

pytestmark = pytest.mark.django_db


@pytest.fixture
def priced(settings: Any) -> None:
    settings.SERVEBENCH_GPU_HOUR_PRICES = {"H200": 3.6, "NVIDIA-H100-80GB-HBM3": 2.5}
    settings.SERVEBENCH_PRICE_CURRENCY = "EUR"


@pytest.fixture
def gpu_run(make_run: Any, spec_dict: Any, measurement: Any, priced: None) -> Any:
    run = make_run(spec=point_spec(spec_dict), status="running")
    body = with_gpus(cpu_point())
    body["metrics"][J_PER_TOKEN] = 999.0  # a runner's own figure: the portal recomputes
    ingest(run, body)
    ingest(run, hf_body(measurement, body["telemetry"]))
    return run


@pytest.fixture
def cpu_run(make_run: Any, spec_dict: Any, priced: None) -> Any:
    run = make_run(spec=point_spec(spec_dict), status="running")
    ingest(run, cpu_point())
    return run


# --------------------------------------------------------------------------- pricing


def test_the_spec_price_wins_then_the_admins_per_gpu_type(priced: None):
    spec = {"resources": {"gpu_hour_price": 1.25}}
    assert energy.price_for(spec, ["NVIDIA H200"]).per_gpu_hour == 1.25
    found = energy.price_for({}, ["", "NVIDIA H200"])  # via servebench's GPU table key
    assert (found.per_gpu_hour, found.currency) == (3.6, "EUR")
    assert found.source == "the portal's price for H200"
    label = energy.price_for({}, ["nvidia h100 80gb hbm3"])  # the node label, any spelling
    assert label.per_gpu_hour == 2.5
    assert energy.price_for({}, ["NVIDIA L4", "cpu"]) is None


def test_ingestion_prices_energy_and_stores_the_series_beside_the_samples(gpu_run: Any):
    rows = {m.backend: m for m in gpu_run.measurements.all()}
    vllm, hf = rows["vllm"], rows["hf-sequential"]
    telemetry = samples.telemetry([vllm])[vllm.pk]
    summary = telemetry["summary"]
    assert summary["gpus"] == 2 and summary["energy_source"] == "counter"
    assert vllm.metrics[J_PER_TOKEN] == pytest.approx(summary["energy_j"] / 1536.0)
    assert vllm.metrics["avg_power_w"] == pytest.approx(summary["avg_power_w"])
    assert 0.9 < vllm.metrics["gpu_util"] <= 1.0
    # 2 GPUs at 3.6 EUR an hour, at the point's measured output tok/s.
    throughput = vllm.metrics["output_throughput"]
    assert vllm.metrics[COST] == pytest.approx(2 * 3.6 / 3600 / throughput * 1e6)
    assert telemetry["price"] == {
        "per_gpu_hour": 3.6,
        "currency": "EUR",
        "source": "the portal's price for H200",
    }
    assert telemetry["server"]["t"] and telemetry["requests"]["sent"]
    assert hf.metrics[J_PER_TOKEN] == pytest.approx(10 * vllm.metrics[J_PER_TOKEN])
    # The per-request arrays are where they were; the row holds neither.
    assert samples.details([vllm])[vllm.pk]["ttfts"]
    assert vllm.detail == {} and "telemetry" not in (vllm.server_metrics or {})


def test_the_result_document_carries_telemetry_and_the_priced_metrics(gpu_run: Any):
    document = documents.result_document(gpu_run)
    vllm = next(m for m in document["measurements"] if m["backend"] == "vllm")
    assert vllm["telemetry"]["summary"]["gpus"] == 2
    assert vllm["metrics"][COST] > 0
    rr.ResultDocument.model_validate(document)


def test_a_run_without_nvml_has_no_energy_and_says_why(cpu_run: Any):
    row = cpu_run.measurements.get()
    assert not set(row.metrics) & set(energy.tm.DERIVED_KEYS)
    telemetry = samples.telemetry([row])[row.pk]
    assert telemetry["gpu"]["status"].startswith("not measured (no NVML): ")
    results = runview.load(cpu_run).results
    summary = energy.summarize(cpu_run, results, {row.pk: telemetry})
    assert not summary.measured and not summary.priced
    assert summary.not_measured.startswith("not measured (no NVML): NVML")


def test_the_summary_says_how_many_fewer_joules_than_the_hf_loop(gpu_run: Any):
    results = runview.load(gpu_run).results
    telemetry = samples.telemetry([p.ids[0] for p in results.points])
    summary = energy.summarize(gpu_run, results, telemetry)
    assert summary.measured and summary.priced
    assert summary.headline.startswith(
        "vllm at concurrency 8 used 10.0x fewer joules per output token than the HF loop"
    )
    assert summary.price["source"] == "the portal's price for H200"


def test_an_unpriced_gpu_says_how_to_price_it(make_run: Any, spec_dict: Any, settings: Any) -> None:
    settings.SERVEBENCH_GPU_HOUR_PRICES = {}
    run = make_run(spec=point_spec(spec_dict), status="running")
    row = ingest(run, with_gpus(cpu_point()))
    assert J_PER_TOKEN in row.metrics and COST not in row.metrics
    results = runview.load(run).results
    summary = energy.summarize(run, results, samples.telemetry([row]))
    assert "set resources.gpu_hour_price" in summary.unpriced


# --------------------------------------------------------------------------- pages


def test_the_run_page_shows_energy_cost_and_the_time_series(client: Any, gpu_run: Any):
    gpu_run.is_public = True
    gpu_run.save()
    page = client.get(gpu_run.get_absolute_url()).content.decode()
    assert 'id="energy-table"' in page and "10.0x fewer joules" in page
    assert "Cost per 1M output tokens" in page and "EUR" in page
    assert 'id="telemetry-data"' in page and "web/telemetry.js" in page
    results = runview.load(gpu_run).results
    part = web_telemetry.page_part(gpu_run, results)
    vllm = next(p for p in part["points"] if p["label"].startswith("vllm"))
    assert part["default"] == vllm["id"]
    names = [t["name"] for t in vllm["server"]["data"]]
    assert names[:2] == ["Requests running", "Requests waiting"] and "Request sent" in names
    sent = next(t for t in vllm["server"]["data"] if t["name"] == "Request sent")
    assert len(sent["x"]) == 48 and min(sent["x"]) == 0.0  # aligned on the first request
    gpu_names = [t["name"] for t in vllm["gpu"]["data"]]
    assert gpu_names == ["Power GPU 0 (W)", "Power GPU 1 (W)", "GPU utilisation (%)"]
    assert "/metrics samples in that time" in vllm["note"]


def test_the_run_page_says_not_measured_without_nvml(client: Any, cpu_run: Any):
    cpu_run.is_public = True
    cpu_run.save()
    page = client.get(cpu_run.get_absolute_url()).content.decode()
    assert 'id="energy-not-measured"' in page and "not measured (no NVML)" in page
    assert 'id="telemetry-data"' in page  # the /metrics series are drawn all the same


def test_compare_judges_energy_and_cost_lower_is_better(
    gpu_run: Any, make_run: Any, spec_dict: Any, measurement: Any
) -> None:
    hotter = make_run(owner=gpu_run.owner, spec=point_spec(spec_dict), status="running")
    body = with_gpus(cpu_point(), load=1.3)
    ingest(hotter, body)
    comparison = compare(gpu_run.owner, [gpu_run.public_id, hotter.public_id], gpu_run.public_id)
    rows = {(r.point.backend, r.metric.key): r for r in comparison.rows}
    row = rows[("vllm", J_PER_TOKEN)]
    assert row.metric.better == "lower" and row.deltas[1] == pytest.approx(0.3, abs=0.02)
    assert row.judgements[1].better == "lower"
    assert row.judgements[1].verdict == "noise not measured"  # one repeat, no history
    assert ("vllm", COST) in rows and ("vllm", "avg_power_w") in rows


def test_compare_and_the_cli_say_not_measured_for_a_run_without_nvml(
    client: Any, gpu_run: Any, cpu_run: Any
) -> None:
    for run in (gpu_run, cpu_run):
        run.is_public = True
        run.status = "succeeded"
        run.save()
    page = client.get(f"/compare/?runs={gpu_run.public_id},{cpu_run.public_id}", follow=True)
    text = page.content.decode()
    assert 'id="energy-note"' in text
    assert f"not measured (no NVML) for {cpu_run.name or cpu_run.short_id}" in text
    base, cand = documents.result_document(gpu_run), documents.result_document(cpu_run)
    result = compare_documents(base, cand, [J_PER_TOKEN, COST])
    verdicts = {v.metric: v for p in result.points for v in p.verdicts}
    assert verdicts[J_PER_TOKEN].verdict == NO_DATA
    assert verdicts[J_PER_TOKEN].notes == [f"{J_PER_TOKEN}: {parse_metric(J_PER_TOKEN).missing}"]
    assert "not measured (no NVML)" in verdicts[J_PER_TOKEN].notes[0]
    same = compare_documents(base, base, [J_PER_TOKEN, COST])
    judged = {v.metric: v for p in same.points for v in p.verdicts}
    assert judged[J_PER_TOKEN].verdict == "within threshold" and judged[COST].better == "lower"
