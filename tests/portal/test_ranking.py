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
