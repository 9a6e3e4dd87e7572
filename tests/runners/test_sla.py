"""The SLA search's rules (runners.sla), on measurements shaped like the result document's.

The search runs against real servers in test_endpoints.py; here its decisions are checked
exhaustively on a stand-in for a server whose latency is a known function of the load,
so every path (converged, top of range, below range, budget spent) is seen.
"""

from __future__ import annotations

from typing import Any

import pytest

from runners import sla
from runners.spec import SpecError, parse_spec, search_point

M = {"id": "org/model", "max_model_len": 4096}


def spec_with(search: dict[str, Any], **extra: Any):
    data = {
        "model": M,
        "workload": {"input_len": 128, "output_len": 32, "num_prompts": 64},
        "backends": [{"kind": "vllm"}],
        "sla_search": search,
        **extra,
    }
    return parse_spec(data)


def measurement(spec, value: float, ttft: float | None, status: str = "succeeded"):
    """A search point's measurement whose TTFT (the SLO's statistic) is ``ttft`` ms."""
    point = search_point(spec, value)
    key = next(k for k in spec.sla_search.slo if k.endswith("_ttft_ms"))
    metrics = {} if ttft is None else {key: ttft, "p99_tpot_ms": 10.0}
    return {
        "backend": "vllm",
        "point": {"key": point.key, "sweep": point.sweep, "value": point.value},
        "repeat": 0,
        "status": status,
        "metrics": metrics,
    }


def run_search(spec, latency) -> list[dict[str, Any]]:
    """Drive the search the way the runner does, with ``latency(load)`` as the server."""
    measured: list[dict[str, Any]] = []
    steps: list[sla.Step] = []
    while (value := sla.next_value(spec.sla_search, steps)) is not None:
        measured.append(measurement(spec, value, latency(value)))
        steps = sla.steps_of(spec, "vllm", measured)
    return measured


RATE = {"axis": "request_rate", "slo": {"p99_ttft_ms": 500}, "low": 1, "high": 64}


def test_a_rate_search_converges_on_the_highest_rate_that_meets_the_slo():
    spec = spec_with({**RATE, "max_points": 10, "tolerance": 0.05})
    capacity = 12.7  # the server keeps p99 TTFT under 500 ms up to this rate

    measured = run_search(spec, lambda rate: 100.0 if rate <= capacity else 4000.0)
    (result,) = sla.summarize(spec, measured)
    assert result["state"] == "converged" and result["finished"]
    assert result["points_used"] <= 10
    low, high = result["bracket"]
    assert low <= capacity < high and high / low - 1 <= 0.05
    assert result["answer"] == low
    assert result["text"] == f"{low:g} req/s at p99 TTFT <= 500 ms"
    # The path: the low end, the high end, then ever closer to the capacity.
    values = [step["value"] for step in result["path"]]
    assert values[:2] == [1.0, 64.0]
    assert [step["passed"] for step in result["path"][:2]] == [True, False]
    assert {low, high} <= set(values)  # both ends of the answer's bracket were measured
    # The run's one sweep point, and the points the search used: not its whole budget.
    assert sla.expected_measurements(spec, measured) == 1 + len(measured)


def test_a_concurrency_search_stops_at_adjacent_values():
    spec = spec_with(
        {"axis": "max_concurrency", "slo": {"p90_ttft_ms": 150}, "low": 1, "high": 16},
        workload={"input_len": 32, "output_len": 64, "num_prompts": 24},
    )
    measured = run_search(spec, lambda c: 50.0 if c <= 4 else 300.0)
    (result,) = sla.summarize(spec, measured)
    assert result["answer"] == 4 and result["bracket"] == [4, 5]
    assert result["text"] == "concurrency 4 at p90 TTFT <= 150 ms"
    assert result["points_used"] <= spec.sla_search.max_points
    assert all(float(v).is_integer() for v in (s["value"] for s in result["path"]))
    point = search_point(spec, 4)
    assert (point.key, point.max_concurrency, point.request_rate) == (
        "sla:max_concurrency=4",
        4,
        None,
    )


@pytest.mark.parametrize(
    ("latency", "state", "answer", "points"),
    [
        (lambda rate: 100.0, "top of range", 64.0, 2),
        (lambda rate: 9000.0, "below range", None, 1),
    ],
    ids=["everything-passes", "nothing-passes"],
)
def test_a_range_that_holds_no_limit_says_so_after_few_points(latency, state, answer, points):
    spec = spec_with(RATE)
    measured = run_search(spec, latency)
    (result,) = sla.summarize(spec, measured)
    assert (result["state"], result["answer"], result["points_used"]) == (state, answer, points)
    if answer is None:
        assert result["text"] == "none: p99 TTFT <= 500 ms is not met even at 1 req/s"
    else:
        assert "it may go higher" in result["text"]
    # The budget it did not need is not expected of the run.
    budget = spec.sla_search.max_points
    assert sla.expected_measurements(spec, measured) == spec.total_measurements() - budget + points


def test_a_spent_budget_gives_the_best_so_far_and_says_it_did_not_converge():
    spec = spec_with({**RATE, "max_points": 3, "tolerance": 0.01})
    measured = run_search(spec, lambda rate: 100.0 if rate <= 20 else 4000.0)
    (result,) = sla.summarize(spec, measured)
    assert result["state"] == "budget spent" and result["points_used"] == 3
    assert result["answer"] == 8.0  # 1 met, 64 missed, 8 met
    assert result["text"] == "8 req/s at p99 TTFT <= 500 ms (not converged: it fails at 64)"


def test_a_failed_point_counts_as_missing_the_slo():
    spec = spec_with(RATE)
    measured = [measurement(spec, 1, 100.0), measurement(spec, 64, None, status="failed")]
    steps = sla.steps_of(spec, "vllm", measured)
    assert [s.passed for s in steps] == [True, False]
    assert steps[1].reason == "the point failed"
    assert sla.next_value(spec.sla_search, steps) == 8.0  # sqrt(1 * 64)


def test_every_limit_must_hold():
    spec = spec_with({**RATE, "slo": {"p99_ttft_ms": 500, "p99_tpot_ms": 5}})
    (step,) = sla.steps_of(spec, "vllm", [measurement(spec, 1, 100.0)])
    assert not step.passed and step.reason == "p99 TPOT 10 ms > 5"
    assert spec.sla_search.describe_slo() == "p99 TTFT <= 500 ms, p99 TPOT <= 5 ms"


def test_only_keys_the_search_could_have_made_are_its_points():
    spec = spec_with(RATE)
    assert sla.search_value(spec, "sla:request_rate=12.5") == 12.5
    assert sla.search_value(spec, "sla:request_rate=12.51") is None  # not a value it rounds to
    assert sla.search_value(spec, "sla:request_rate=65") is None  # outside the range
    assert sla.search_value(spec, "sla:max_concurrency=4") is None
    assert sla.search_value(spec, "other:request_rate=2") is None


def test_a_rate_search_sends_at_that_rate_without_a_concurrency_cap():
    spec = spec_with(RATE)
    point = search_point(spec, 12.5)
    assert point.request_rate == 12.5 and point.max_concurrency == 64  # num_prompts
    assert spec.total_measurements() == 1 + 8  # one point, plus the search's budget


@pytest.mark.parametrize(
    ("search", "extra", "field", "words"),
    [
        ({**RATE, "slo": {"p95_ttft_ms": 1}}, {}, "sla_search.slo.p95_ttft_ms", "not a latency"),
        ({**RATE, "low": 64, "high": 1}, {}, "sla_search.high", "above low"),
        ({**RATE, "axis": "max_concurrency", "low": 1.5}, {}, "sla_search.low", "whole number"),
        ({**RATE, "backends": ["nope"]}, {}, "sla_search.backends.0", "not a vllm or endpoint"),
        (
            {**RATE, "name": "c"},
            {"sweeps": [{"name": "c", "axis": "max_concurrency", "values": [1]}]},
            "sla_search.name",
            "taken by a sweep",
        ),
        (RATE, {"backends": [{"kind": "hf-sequential"}]}, "sla_search", "needs a vllm"),
        (
            RATE,
            {
                "workload": {
                    "input_len": 8,
                    "output_len": 8,
                    "num_prompts": 8,
                    "ramp_up": {"start_rps": 1, "end_rps": 4},
                }
            },
            "sla_search.axis",
            "remove workload.ramp_up",
        ),
    ],
    ids=["metric", "range", "whole-concurrency", "backend", "name", "no-server", "ramp-up"],
)
def test_a_bad_search_is_refused_naming_the_field(search, extra, field, words):
    with pytest.raises(SpecError) as caught:
        spec_with(search, **extra)
    first = caught.value.errors[0]
    assert first["field"] == field, caught.value.errors
    assert words in first["message"]
