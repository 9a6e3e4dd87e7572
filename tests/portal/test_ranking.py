"""The ranking of a run's configurations (portal.benchmarks.ranking) against numbers worked
out by hand: a configuration search over max_num_seqs 4, 1, 8 with an SLA search on
concurrency (p99 TTFT <= 300 ms), stored through the real ingestion. Each configuration
meets the SLO up to a concurrency of its max_num_seqs; output tok/s is 10 x the load and
median TPOT 4 ms (seqs8: 5 ms). The browser test of the page's section is in
tests/portal/browser/test_ranking_page.py."""

from __future__ import annotations

from typing import Any

import pytest

from portal.benchmarks import documents, ingestion, ranking, runview
from runners import result as rr
from runners import sla
from runners.spec import parse_spec
from servebench import render

pytestmark = pytest.mark.django_db

SLO = {"p99_ttft_ms": 300}
SEARCH = {"axis": "max_concurrency", "slo": SLO, "low": 1, "high": 16, "max_points": 6}
CAPACITY = {"vllm-seqs4": 4, "vllm-seqs1": 1, "vllm-seqs8": 8}


def config_spec(spec_dict: Any) -> dict[str, Any]:
    return spec_dict(
        sweeps=[],
        config_search={"grid": {"max_num_seqs": [4, 1, 8]}},
        sla_search=SEARCH,
    )


def body(measurement: Any, backend: str, key: str, value: float, repeat: int = 0) -> Any:
    ttft = 100.0 if value <= CAPACITY[backend] else 900.0
    b = measurement(backend, key, repeat)
    b["metrics"].update(
        output_throughput=10.0 * value,
        p99_ttft_ms=ttft,
        median_tpot_ms=5.0 if backend == "vllm-seqs8" else 4.0,
    )
    return rr.Measurement.model_validate(b)


def searched_run(make_run: Any, spec_dict: Any, measurement: Any) -> Any:
    """The run as the runner measures it: each configuration's sweep point, then its
    search, the later ones gated by the leader's answer (runners.sla.gates)."""
    data = config_spec(spec_dict)
    run = make_run(spec=data, status="running")
    spec = parse_spec(run.spec, stored=True)
    done: list[Any] = []
    for name in spec.config_names:
        single = body(measurement, name, "single", 1.0)
        single.point = single.point.model_copy(update={"axis": None, "value": None})
        ingestion.ingest_measurement(run, single)
        done.append(single)
        gate = sla.gates(spec, done).get(name)
        steps: list[sla.Step] = []
        while (value := sla.next_value(spec.sla_search, steps, gate)) is not None:
            repeat = sla.next_repeat(steps, value)
            m = body(measurement, name, f"sla:max_concurrency={value:g}", value, repeat)
            ingestion.ingest_measurement(run, m)
            done.append(m)
            steps = sla.steps_of(spec, name, done)
    return run


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
