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
from servebench import render

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


def measurement(spec, value: float, ttft: float | None, status: str = "succeeded", repeat: int = 0):
    """A search point's measurement whose TTFT (the SLO's statistic) is ``ttft`` ms."""
    point = search_point(spec, value)
    key = next(k for k in spec.sla_search.slo if k.endswith("_ttft_ms"))
    metrics = {} if ttft is None else {key: ttft, "p99_tpot_ms": 10.0}
    return {
        "backend": "vllm",
        "point": {"key": point.key, "sweep": point.sweep, "value": point.value},
        "repeat": repeat,
        "status": status,
        "metrics": metrics,
    }


def run_search(spec, latency) -> list[dict[str, Any]]:
    """Drive the search the way the runner does, with ``latency(load)`` as the server
    (``latency(load, repeat)`` when it takes two arguments: a server that stalls once)."""
    measured: list[dict[str, Any]] = []
    steps: list[sla.Step] = []
    while (value := sla.next_value(spec.sla_search, steps)) is not None:
        repeat = sla.next_repeat(steps, value)
        try:
            ttft = latency(value, repeat)
        except TypeError:
            ttft = latency(value)
        measured.append(measurement(spec, value, ttft, repeat=repeat))
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
        (lambda rate: 9000.0, "below range", None, 2),  # the low end, and again
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
        (
            {**RATE, "slo": {"p95_ttft_ms": 1}},
            {},
            "sla_search.slo.p95_ttft_ms",
            "did you mean 'p99_ttft_ms'",
        ),
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


def test_a_one_off_stall_at_the_low_end_does_not_end_the_search():
    """The CI failure this guards against: one stall of a shared machine made the low end
    miss, and the search said "below range" after one measurement. A miss is measured
    again; the search goes on from the second verdict."""
    spec = spec_with({**RATE, "max_points": 10, "tolerance": 0.05})

    def stalls_once(rate: float, repeat: int) -> float:
        if rate == 1 and repeat == 0:
            return 3100.0  # a 3-second stall
        return 100.0 if rate <= 12.7 else 4000.0

    measured = run_search(spec, stalls_once)
    (result,) = sla.summarize(spec, measured)
    assert result["state"] == "converged" and 12.7 / 1.05 <= result["answer"] <= 12.7
    path = result["path"]
    assert [(s["value"], s["repeat"], s["passed"]) for s in path[:3]] == [
        (1.0, 0, False),
        (1.0, 1, True),
        (64.0, 0, False),
    ]
    assert result["points_used"] == len(measured) <= 10  # the confirmation counts
    (line,) = render.sla_lines({"sla_searches": [result]})
    assert "; path 1 missed, 1 again met, 64 missed, " in line  # the CLI's line
    assert sla.expected_measurements(spec, measured) == 1 + len(measured)
    # While the confirmation is pending, the search is running, not below range.
    (first,) = sla.summarize(spec, measured[:1])
    assert (first["state"], first["finished"], first["answer"]) == ("running", False, None)


@pytest.mark.parametrize(
    ("confirm", "again"),
    [("none", []), ("low", []), ("failures", [64.0, 8.0])],
)
def test_confirm_says_which_misses_are_measured_again(confirm, again):
    spec = spec_with({**RATE, "confirm": confirm, "max_points": 6})
    measured = run_search(spec, lambda rate: 100.0 if rate <= 5 else 4000.0)
    (result,) = sla.summarize(spec, measured)
    repeated = [s["value"] for s in result["path"] if s["repeat"] == 1]
    assert repeated == again
    # A miss measured again that misses again stays a miss: the answer never exceeds 5.
    assert result["answer"] is not None and result["answer"] <= 5
    assert result["points_used"] <= 6


def test_a_stall_on_a_miss_is_believed_only_when_it_repeats():
    spec = spec_with({**RATE, "confirm": "failures", "max_points": 12, "tolerance": 0.05})

    def stalls_at_8(rate: float, repeat: int) -> float:
        if rate == 8 and repeat == 0:
            return 3100.0
        return 100.0 if rate <= 12.7 else 4000.0

    (result,) = sla.summarize(spec, run_search(spec, stalls_at_8))
    assert 12.7 / 1.05 <= result["answer"] <= 12.7  # not lowered below 8 by the stall
    nothing = spec_with({**RATE, "confirm": "none"})
    (alone,) = sla.summarize(nothing, run_search(nothing, lambda rate: 9000.0))
    assert (alone["state"], alone["points_used"]) == ("below range", 1)


def test_repeats_the_search_would_not_have_made_are_not_its_steps():
    spec = spec_with(RATE)
    measured = [
        measurement(spec, 1, 100.0),
        measurement(spec, 1, 100.0, repeat=1),  # the low end met: nothing to confirm
        measurement(spec, 64, 9000.0, repeat=2),
    ]
    steps = sla.steps_of(spec, "vllm", measured)
    assert [(s.value, s.repeat) for s in steps] == [(1.0, 0)]


def test_a_run_stored_before_confirm_existed_reads_as_measured_once():
    """Its finished search ended "below range" after one miss; read with the default
    ``confirm: low`` it would seem to wait for a confirmation, so a stored spec without
    the field reads as ``confirm: none``."""
    data = {
        "model": M,
        "workload": {"input_len": 128, "output_len": 32, "num_prompts": 64},
        "backends": [{"kind": "vllm"}],
        "sla_search": RATE,
    }
    stored = parse_spec(data, stored=True)
    assert stored.sla_search.confirm == "none"
    assert parse_spec(data).sla_search.confirm == "low"  # a new spec
    assert parse_spec(parse_spec(data).model_dump(mode="json"), stored=True).sla_search.confirm == (
        "low"
    )  # a new run's stored spec keeps what it was measured with
    (result,) = sla.summarize(stored, [measurement(stored, 1, 9000.0)])
    assert (result["state"], result["finished"]) == ("below range", True)


def test_a_budget_spent_on_a_confirmation_says_so():
    """Two points: the low end misses, then meets when measured again; nothing above it
    was measured, so the search has not converged on anything."""
    spec = spec_with({**RATE, "max_points": 2})
    measured = [measurement(spec, 1, 3100.0), measurement(spec, 1, 100.0, repeat=1)]
    (result,) = sla.summarize(spec, measured)
    assert (result["state"], result["finished"], result["answer"]) == ("budget spent", True, 1.0)
    assert result["text"].endswith("(not converged: the high end was not measured)")


def test_a_point_that_failed_outright_is_believed_not_measured_again():
    """A failed point (a server that never started, a client error) is not latency noise:
    a failed low end ends the search at once, with the runner's total and the portal's
    expected count in agreement."""
    spec = spec_with(RATE)
    measured = [measurement(spec, 1, None, status="failed")]
    steps = sla.steps_of(spec, "vllm", measured)
    assert sla.next_value(spec.sla_search, steps) is None
    (result,) = sla.summarize(spec, measured)
    assert (result["state"], result["finished"], result["points_used"]) == ("below range", True, 1)
    budget = spec.sla_search.max_points
    assert sla.expected_measurements(spec, measured) == spec.total_measurements() - budget + 1


def test_a_confirmation_supersedes_the_miss_it_measured_again():
    spec = spec_with(RATE)
    ids = [("vllm", "sla:request_rate=1", 0), ("vllm", "sla:request_rate=1", 1)]
    ids += [("vllm", "sla:request_rate=64", 0), ("vllm", "single", 0), ("vllm", "single", 1)]
    assert sla.superseded(spec, ids) == {("vllm", "sla:request_rate=1", 0)}
    assert sla.superseded(None, ids) == set()


def test_a_search_the_run_left_unfinished_says_what_it_learned_as_a_bound():
    """The server died at 64 req/s mid-search: the run is over, so its search is not
    "running", nor is 1 req/s its answer; it met the SLO at 1 and is stopped."""
    spec = spec_with(RATE)
    measured = [measurement(spec, 1, 100.0), measurement(spec, 64, None, status="failed")]
    (live,) = sla.summarize(spec, measured)
    assert (live["state"], live["text"]) == ("running", "1 req/s at p99 TTFT <= 500 ms so far")
    (ended,) = sla.summarize(spec, measured, ended=True)
    assert (ended["state"], ended["finished"], ended["answer"]) == ("stopped", False, 1.0)
    assert ended["text"] == (
        "at least 1 req/s at p99 TTFT <= 500 ms (stopped after 2 points; run it again for "
        "the answer)"
    )
    (none,) = sla.summarize(spec, [], ended=True)
    assert (none["state"], none["text"]) == (
        "stopped",
        "not measured: the run ended before the search began",
    )
    (missed,) = sla.summarize(spec, [measurement(spec, 1, 900.0)], ended=True)
    assert missed["state"] == "stopped" and missed["text"].startswith("none found")
    # A search that finished reads the same whether or not the run has ended.
    done = run_search(spec, lambda rate: 100.0 if rate <= 12.5 else 4000.0)
    assert sla.summarize(spec, done, ended=True) == sla.summarize(spec, done)
    (one,) = sla.summarize(spec, [measurement(spec, 1, 900.0)], ended=True)
    assert one["text"].endswith("(stopped after 1 point; run it again for the answer)")
