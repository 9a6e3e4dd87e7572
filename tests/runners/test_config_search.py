"""Configuration search: the spec's expansion (names, errors, limits, round trip), early
dropping at the leader's answer (runners.sla.gates) and the budget and outcomes
(runners.configsearch), on measurements shaped like the result document's. The real run
on the tiny model is in tests/cli/test_config_search_run.py."""

from __future__ import annotations

from typing import Any

import pytest

from runners import configsearch as cs
from runners import sla
from runners.spec import MAX_POINTS, SpecError, parse_spec, search_point

M = {"id": "org/model", "max_model_len": 4096}
SEARCH = {
    "axis": "max_concurrency",
    "slo": {"p99_ttft_ms": 300},
    "low": 1,
    "high": 16,
    "max_points": 6,
    "confirm": "low",  # a miss at the low end or at a gate is measured once more
}


def spec_with(config_search: dict[str, Any], **extra: Any):
    data = {
        "model": M,
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 16},
        "backends": [{"kind": "hf-sequential"}, {"kind": "vllm", "max_num_batched_tokens": 512}],
        "config_search": config_search,
        **extra,
    }
    return parse_spec(data)


def error_of(config_search: dict[str, Any], **extra: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        spec_with(config_search, **extra)
    return info.value.errors[0]


def test_a_grid_becomes_one_named_backend_per_combination_where_the_base_was():
    spec = spec_with({"grid": {"max_num_seqs": [1, 4], "enable_prefix_caching": [True, False]}})
    names = [b.name for b in spec.backends]
    assert names == [
        "hf-sequential",
        "vllm-seqs1-prefix",
        "vllm-seqs1-noprefix",
        "vllm-seqs4-prefix",
        "vllm-seqs4-noprefix",
    ]
    assert spec.config_names == names[1:]
    first = spec.config_backends[0]
    # The base's own settings stay; the override wins.
    assert first.max_num_batched_tokens == 512 and first.max_num_seqs == 1
    assert first.enable_prefix_caching is True


def test_a_list_of_configs_keeps_given_names_and_names_the_rest():
    spec = spec_with(
        {
            "configs": [
                {"name": "fast", "max_num_seqs": 16},
                {"extra_args": ["--no-enable-chunked-prefill"]},
                {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
                {"kv_cache_dtype": "fp8"},
            ]
        }
    )
    assert spec.config_names == ["fast", "vllm-nochunked", "vllm-spec-ngram", "vllm-kv-fp8"]


def test_the_stored_spec_re_parses_to_the_same_configurations_without_expanding_twice():
    spec = spec_with({"grid": {"max_num_seqs": [1, 4, 16]}}, sla_search=SEARCH)
    stored = spec.model_dump(mode="json")
    assert [b["name"] for b in stored["backends"]][1:] == spec.config_names
    again = parse_spec(stored, stored=True)
    assert again.model_dump(mode="json") == stored
    assert [b.name for b in again.search_backends] == spec.config_names
    # Submitted again as is (an edited copy of a run), too.
    assert parse_spec(stored).model_dump(mode="json") == stored


@pytest.mark.parametrize(
    ("config_search", "field", "words"),
    [
        ({"grid": {"max_num_seq": [1, 2]}}, "config_search.grid.max_num_seq", "did you mean"),
        ({"grid": {"max_num_seqs": [1, 0]}}, "config_search.grid.max_num_seqs.1", "greater"),
        ({"grid": {"max_num_seqs": [4, 4]}}, "config_search.grid.max_num_seqs.1", "twice"),
        ({"grid": {"name": ["a", "b"]}}, "config_search.grid.name", "may not change"),
        (
            {"configs": [{"max_num_seqs": 2}, {"kv_cache_dtype": "fp9"}]},
            "config_search.configs.1.kv_cache_dtype",
            "not one of the choices: auto",
        ),
        (
            {"configs": [{"extra_args": ["--host", "127.0.0.2"]}, {"max_num_seqs": 2}]},
            "config_search.configs.0.extra_args.0",
            "set by the runner",
        ),
        (
            {"configs": [{"max_num_seqs": 2}, {"name": "b", "max_num_seqs": 2}]},
            "config_search.configs.1",
            "same server",
        ),
        ({"base": "vlm", "grid": {"max_num_seqs": [1, 2]}}, "config_search.base", "not a backend"),
        ({"base": "hf-sequential", "grid": {"max_num_seqs": [1, 2]}}, "config_search.base", "vllm"),
        ({"grid": {"max_num_seqs": [1]}}, "config_search.grid", "at least two"),
        (
            {"grid": {"max_num_seqs": [1, 2]}, "configs": [{"max_num_seqs": 1}]},
            "config_search",
            "either grid",
        ),
        (
            {"grid": {"max_num_seqs": [1, 2, 3, 4, 5], "block_size": [16, 32, 64, 128]}},
            "config_search.grid",
            "at most 16",
        ),
    ],
)
def test_a_bad_search_names_the_field_and_the_reason(config_search, field, words):
    error = error_of(config_search)
    assert error["field"] == field
    assert words in error["message"]


def test_the_configurations_count_toward_the_point_limit():
    search = {**SEARCH, "max_points": 32}
    error = error_of(
        {"grid": {"max_num_seqs": [1, 2, 3, 4, 5, 6, 7, 8], "enforce_eager": [True, False]}},
        sla_search=search,
    )
    assert f"the limit is {MAX_POINTS}" in error["message"]
    assert error_of({"grid": {"max_num_seqs": [1, 2]}, "budget": {}}, sla_search=search) == {
        "field": "config_search.budget",
        "message": "a budget needs points, minutes or both",
    }


def test_a_search_on_the_base_name_searches_every_configuration_and_round_trips():
    many = spec_with(
        {"grid": {"max_num_seqs": [1, 2, 3, 4, 5], "enforce_eager": [True, False]}},
        sla_search={**SEARCH, "max_points": 2, "backends": ["vllm"]},
    )
    assert len(many.search_backends) == 10
    stored = many.model_dump(mode="json")
    assert parse_spec(stored, stored=True).model_dump(mode="json") == stored


def test_a_search_on_the_base_name_searches_every_configuration():
    spec = spec_with(
        {"grid": {"max_num_seqs": [1, 4]}}, sla_search={**SEARCH, "backends": ["vllm"]}
    )
    assert [b.name for b in spec.search_backends] == ["vllm-seqs1", "vllm-seqs4"]


# --------------------------------------------------------------- early dropping, budget


def measurement(spec, backend: str, value: float, ttft: float, repeat: int = 0) -> dict[str, Any]:
    point = search_point(spec, value)
    return {
        "backend": backend,
        "point": {"key": point.key},
        "repeat": repeat,
        "status": "succeeded",
        "metrics": {"p99_ttft_ms": ttft},
    }


def drive(spec, capacities: dict[str, float]) -> list[dict[str, Any]]:
    """Search every configuration in order as the runner does; a configuration meets the
    SLO up to its capacity (concurrency)."""
    measured: list[dict[str, Any]] = []
    for name in spec.config_names:
        gate = sla.gates(spec, measured).get(name)
        steps: list[sla.Step] = []
        while (value := sla.next_value(spec.sla_search, steps, gate)) is not None:
            repeat = sla.next_repeat(steps, value)
            ttft = 100.0 if value <= capacities[name] else 900.0
            measured.append(measurement(spec, name, value, ttft, repeat))
            steps = sla.steps_of(spec, name, measured)
    return measured


def test_a_configuration_that_misses_at_the_leaders_answer_is_dropped_and_said_so():
    spec = spec_with({"grid": {"max_num_seqs": [4, 1, 8]}}, sla_search=SEARCH)
    measured = drive(spec, {"vllm-seqs4": 4, "vllm-seqs1": 1, "vllm-seqs8": 8})
    results = {r["backend"]: r for r in sla.summarize(spec, measured, ended=True)}
    first, dropped, better = (results[n] for n in spec.config_names)
    assert first["answer"] == 4 and first["gate"] is None
    # Measured at concurrency 4 (missed), confirmed once (confirm: low), then dropped.
    assert [s["value"] for s in dropped["path"]] == [4.0, 4.0]
    assert dropped["state"] == "dropped" and dropped["answer"] is None
    assert dropped["text"].startswith(
        "dropped: missed p99 TTFT <= 300 ms at concurrency 4 where vllm-seqs4 met it"
    )
    # It passed at the leader's answer: its search went on above it and beat the leader.
    assert better["path"][0]["value"] == 4.0 and better["answer"] == 8
    assert better["gate"] == {"value": 4.0, "leader": "vllm-seqs4"}
    # The run's total counts the points a dropped search did not need.
    # + the HF baseline and each configuration's sweep point (not driven here)
    assert sla.expected_measurements(spec, measured) == len(measured) + 1 + 3
    states = [o["state"] for o in cs.outcomes(spec, measured, list(results.values()), ended=True)]
    assert states == ["measured", "dropped", "measured"]


def test_without_early_drop_every_configuration_starts_at_the_low_end():
    spec = spec_with({"grid": {"max_num_seqs": [4, 1]}, "early_drop": False}, sla_search=SEARCH)
    measured = drive(spec, {"vllm-seqs4": 4, "vllm-seqs1": 1})
    assert sla.gates(spec, measured) == {}
    assert next(m["point"]["key"] for m in measured if m["backend"] == "vllm-seqs1") == (
        "sla:max_concurrency=1"
    )


def test_the_budget_stops_the_next_configuration_and_the_outcome_says_why():
    spec = spec_with(
        {"grid": {"max_num_seqs": [4, 1, 8]}, "budget": {"points": 3, "minutes": 10}},
        sla_search=SEARCH,
    )
    measured = [measurement(spec, "vllm-seqs4", v, 100.0) for v in (1, 16)]
    assert cs.budget_reason(spec, measured, elapsed_s=5) is None
    assert "10 minutes" in (cs.budget_reason(spec, measured, elapsed_s=601) or "")
    measured.append(measurement(spec, "vllm-seqs1", 16, 900.0))
    why = cs.budget_reason(spec, measured, elapsed_s=5)
    assert why == "the budget of 3 points was spent (3 measured)"
    timings = {cs.TIMINGS_KEY: {cs.NOT_MEASURED: {"vllm-seqs8": f"not measured: {why}"}}}
    outcome = cs.outcomes(spec, measured, [], cs.skipped_of(timings), ended=True)[2]
    assert outcome["state"] == "not measured" and "3 points" in outcome["reason"]
    assert outcome["overrides"] == {"max_num_seqs": 8}
    # One sweep point (no sweep) + the search's 6 points.
    assert cs.planned_measurements(spec, "vllm-seqs8") == 1 + 6


def test_a_search_over_images_names_each_configuration_by_its_tag_or_digest():
    """Judging a vLLM version: one configuration per image (each server in a Pod of its
    own on Kubernetes), named by the tag or the digest's start."""
    images = [
        "registry.example.com/servebench-runner:vllm-0.32.0",
        "registry.example.com/servebench-runner:vllm-0.33.1",
        "registry.example.com/servebench-runner@sha256:abcdef0123456789abcdef",
    ]
    spec = spec_with({"grid": {"image": images}})
    assert spec.config_names == [
        "vllm-img-vllm-0.32.0",
        "vllm-img-vllm-0.33.1",
        "vllm-img-sha256-abcdef012345",
    ]
    assert [b.image for b in spec.config_backends] == images
    # An image is one argv-free string like resources.image: no shell in it.
    with pytest.raises(SpecError) as info:
        spec_with({"grid": {"image": [images[0], "x; rm -rf /"]}})
    assert "image" in info.value.errors[0]["message"]
