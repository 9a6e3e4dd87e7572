"""The ranking of a run's configurations (portal.benchmarks.ranking) against numbers worked
out by hand: a configuration search over max_num_seqs 4, 1, 8 with an SLA search on
concurrency (p99 TTFT <= 300 ms), stored through the real ingestion. Each configuration
meets the SLO up to a concurrency of its max_num_seqs; output tok/s is 10 x the load and
median TPOT 4 ms (seqs8: 5 ms). The browser test of the page's section is in
tests/portal/browser/test_browser_ranking.py."""

from __future__ import annotations

import pytest
from rankingdata import searched_run

from portal.benchmarks import documents, ingestion, ranking, runview
from runners import configsearch as cs
from runners import result as rr
from servebench import render

pytestmark = pytest.mark.django_db


def test_the_ranking_orders_by_the_sla_answer_and_says_why(make_run, spec_dict, measurement):
    run = searched_run(make_run, spec_dict, measurement)
    run.status = "succeeded"
    view = runview.load(run)
    searches = ingestion.sla_searches(run, view.spec)
    outcomes = ingestion.config_outcomes(run, view.spec, searches)
    found = ranking.rank(view, searches, outcomes)
    assert found is not None
    rows = {e.backend: e for e in found.entries}
    assert [e.backend for e in found.entries] == ["vllm-seqs8", "vllm-seqs4", "vllm-seqs1"]
    win, second, dropped = (rows[n] for n in ("vllm-seqs8", "vllm-seqs4", "vllm-seqs1"))
    assert (win.rank, win.answer, win.throughput) == (1, 8.0, 80.0)
    # A CPU run: per server. Per user: 1000 / median TPOT.
    assert found.per == "server" and win.gpus == 0
    assert win.per_gpu == 80.0 and win.per_user == pytest.approx(200.0)
    assert (second.rank, second.answer, second.per_user) == (2, 4.0, 250.0)
    assert dropped.rank is None and dropped.state == "dropped"
    assert "where vllm-seqs4 met it" in dropped.reason
    assert win.as_dict()["energy_per_output_token_j"] is None  # no NVML: unknown
    assert "--max-num-seqs 8" in win.serve_command
    assert found.why.startswith(
        "vllm-seqs8 wins: concurrency 8 at p99 TTFT <= 300 ms (80 output tok/s there)."
    )
    assert "The runner-up vllm-seqs4 met it up to concurrency 4 (40 output tok/s)" in found.why
    # Pareto over every load point, within the SLO or not: seqs4 at 16 (160 tok/s, 250 per
    # user) beats every other point on both; seqs8 reaches 160 tok/s only at 200 per user.
    front = [(p["backend"], p["point"]) for p in found.front if p["front"]]
    assert front == [("vllm-seqs4", "sla:max_concurrency=16")]
    loads = {(m.backend, m.point_key) for m in view.measurements if m.point_key != "single"}
    assert len(found.front) == len(loads)
    document = found.as_dict()
    assert document["winner"] == "vllm-seqs8"
    assert [e["state"] for e in document["entries"]] == ["measured", "measured", "dropped"]


def test_a_run_with_one_served_configuration_has_no_ranking(make_run, spec_dict):
    view = runview.load(make_run(spec=spec_dict()))
    assert ranking.rank(view) is None


def test_the_result_document_and_the_cli_carry_the_ranking(make_run, spec_dict, measurement):
    run = searched_run(make_run, spec_dict, measurement)
    document = documents.result_document(run)
    assert document["ranking"]["winner"] == "vllm-seqs8"
    assert [o["state"] for o in document["config_search"]] == ["measured", "dropped", "measured"]
    lines = render.ranking_lines(document)
    text = "\n".join(lines)
    assert lines[0].startswith("ranking (by the highest load meeting p99 TTFT <= 300 ms")
    row = next(line for line in lines[1].splitlines() if "vllm-seqs8" in line)
    assert row.split()[:5] == ["1", "vllm-seqs8", "measured", "concurrency", "8"]
    assert "unknown" in row  # J/token and cost: no NVML on this run
    assert "dropped: missed p99 TTFT <= 300 ms at concurrency 4" in text
    assert "serve the winner: vllm serve org/tiny-model" in text and "--max-num-seqs 8" in text
    assert "vllm-seqs8 wins" in render.results_table(document)


def test_configurations_the_budget_did_not_start_leave_the_run_complete(
    make_run, spec_dict, measurement
):
    run = searched_run(make_run, spec_dict, measurement, configs=2, budget={"points": 5})
    run.spec["backends"] = [b for b in run.spec["backends"] if b["kind"] != "hf-sequential"]
    run.save(update_fields=["spec"])
    why = "not measured: the budget of 5 points was spent (6 measured)"
    timings = {cs.TIMINGS_KEY: {cs.NOT_MEASURED: {"vllm-seqs8": why}}}
    event = rr.Event(type="finished", status="succeeded", timings=timings)
    assert ingestion.ingest_event(run, event) == "succeeded"
    run.refresh_from_db()
    assert run.progress_total == run.progress_done == 10  # seqs4: 1 + 6, seqs1: 1 + 2
    outcome = ingestion.config_outcomes(run)[2]
    assert (outcome["state"], outcome["reason"]) == ("not measured", why)
    found = documents.result_document(run)["ranking"]
    assert found["entries"][-1]["backend"] == "vllm-seqs8"
    assert found["entries"][-1]["reason"] == why and found["entries"][-1]["rank"] is None


# Ten requests of 16 output tokens, alternately 0.2 s and 0.6 s: per-request rate 40 tok/s
# over the whole, residuals 16 - 40 x latency = +-8, sample sd 8 x sqrt(10/9), standard
# error 8 x sqrt(10/9) / (0.4 x sqrt(10)) = 20/3 tok/s, 1/6 of the rate; the 95%
# request-level interval of a throughput is therefore +-1.95996/6 = +-32.666% of it.
SPREAD = 1.959964 / 6


def _two_configs(make_run, spec_dict, measurement, second: float):
    """max_num_seqs 4 and 8, no SLA search: ranked by output tok/s per server at their best
    load point, each measured once with its requests' samples (100 and ``second`` tok/s)."""
    spec = spec_dict(sweeps=[{"name": "concurrency", "axis": "max_concurrency", "values": [4]}])
    spec["backends"] = [{"kind": "vllm"}]
    spec["config_search"] = {"grid": {"max_num_seqs": [4, 8]}}
    run = make_run(spec=spec, status="running")
    detail = {
        "ttfts": [0.05] * 10,
        "latencies": [0.2, 0.6] * 5,
        "output_lens": [16] * 10,
        "input_lens": [64] * 10,
        "errors": [""] * 10,
    }
    for name, tput in (("vllm-seqs4", 100.0), ("vllm-seqs8", second)):
        b = measurement(name, "concurrency:max_concurrency=4", detail=dict(detail))
        b["point"]["num_prompts"] = 10
        b["metrics"]["output_throughput"] = tput
        ingestion.ingest_measurement(run, rr.Measurement.model_validate(b))
    run.status = "succeeded"
    view = runview.load(run)
    return ranking.rank(view, [], ingestion.config_outcomes(run, view.spec, []))


def test_each_ranked_throughput_carries_its_noise_and_the_why_says_if_the_order_is_settled(
    make_run, spec_dict, measurement
):
    close = _two_configs(make_run, spec_dict, measurement, second=90.0)
    win, second = close.entries
    assert (win.backend, second.backend) == ("vllm-seqs4", "vllm-seqs8")
    assert win.noise.low == pytest.approx(100 * (1 - SPREAD), rel=1e-4)
    assert win.noise.high == pytest.approx(100 * (1 + SPREAD), rel=1e-4)
    row = win.as_dict()["output_throughput_interval"]
    assert row["spread"] == "±32.7%" and row["method"] == "request-level"
    assert row["text"] == "±32.7% (95% request-level interval, 10 requests, 1 repeat)"
    # 100 against 90, each +-32.7%: the intervals overlap, so the order is not settled.
    assert "The gap is within noise (±32.7% and ±32.7%, 95%)" in close.why
    assert "repeats: 3 or more" in close.why
    text = "\n".join(render.ranking_lines({"ranking": close.as_dict()}))
    assert "100 ±32.7%" in text

    # 100 (67.3-132.7) against 40 (26.9-53.1): apart.
    apart = _two_configs(make_run, spec_dict, measurement, second=40.0)
    assert "The gap is beyond noise (±32.7% and ±32.7%, 95%)." in apart.why
