"""Spec text is read as JSON would read it, and what validates input means what it says.

- ``safe_yaml`` (runners.spec.yamlload): YAML 1.2 core scalars; YAML 1.1's other readings
  (base-60, yes/no/on/off, octal, hex, grouped digits) and keys given twice are refused
  naming the field; JSON text keeps its numbers.
- Patterns anchored with ``\\Z``: a trailing newline is not a valid id, URL or name.
- ``json_problem``: keys with controls or overrides, lone surrogates, a marked duplicate;
  the path it names is safe to echo.
- The runner's measurement and event models: numbers are finite and never negative.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from runners import spec as rs
from runners.result import Event, Measurement, ServerMetrics

BASE = "model: {id: org/m}\n"


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        ("workload: {input_len: 1:30}", "workload.input_len", "write 90"),
        ("workload: {ignore_eos: yes}", "workload.ignore_eos", "write true"),
        ("workload: {ignore_eos: NO}", "workload.ignore_eos", "write false"),
        ("resources: {gpu_count: On}", "resources.gpu_count", "write true"),
        ("workload: {seed: 010}", "workload.seed", "the octal number 8"),
        ("workload: {seed: 09}", "workload.seed", "write 9"),
        ("workload: {seed: 0x1F}", "workload.seed", "write 31"),
        ("workload: {seed: 0o17}", "workload.seed", "write 15"),
        ("workload: {seed: 0b101}", "workload.seed", "write 5"),
        ("workload: {num_prompts: 1_000}", "workload.num_prompts", "write 1000"),
        ("workload: {request_rate: 1:30.5}", "workload.request_rate", "write 90.5"),
        ("workload: {seed: !!int 010}", "workload.seed", "not a YAML 1.2 int"),
        ("sweeps: [{name: c, axis: max_concurrency, values: [1, 010]}]", "sweeps.0.values.1",
         "leading zero"),
        ("repeats: 1\nrepeats: 2", "repeats", "given twice (lines 2 and 3)"),
        ("workload: {seed: 1, seed: 2}", "workload.seed", "given twice"),
        ('workload: {seed: 1, "seed": 2}', "workload.seed", "given twice"),
    ],
)  # fmt: skip
def test_yaml_that_json_would_read_otherwise_is_refused_at_its_field(
    text: str, field: str, says: str
) -> None:
    with pytest.raises(rs.YAMLFieldError) as refused:
        rs.safe_yaml(BASE + text)
    assert refused.value.field == field
    assert says in refused.value.message, refused.value.message
    with pytest.raises(rs.SpecError) as as_spec:
        rs.loads_spec(BASE + text)
    assert as_spec.value.errors == [{"field": field, "message": refused.value.message}]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("a: 1e3", 1000.0),  # JSON's number (a string in YAML 1.1)
        ("a: 1.5E-3", 0.0015),
        ("a: -0", 0),
        ("a: +7", 7),
        ("a: 0", 0),
        ("a: 0.5", 0.5),
        ("a: 2026-01-31", "2026-01-31"),  # text, not a date
        ("a: '1:30'", "1:30"),
        ("a: 'yes'", "yes"),
        ("a: !!str off", "off"),
        ("a: ~", None),
        ("a: True", True),
        ("a: y", "y"),
        ("<<: {b: 1}", {"<<": {"b": 1}}),  # a key like any other: no YAML 1.1 merge
        ('{"a": [1, 2.5, true, null, "x"]}', [1, 2.5, True, None, "x"]),
    ],
)
def test_what_yaml_12_and_json_read_is_read(text: str, value: Any) -> None:
    data = rs.safe_yaml(text)
    assert (data if text.startswith("<<") else data["a"]) == value


def test_a_huge_integer_or_inf_is_refused_at_its_field_not_as_a_parse_error() -> None:
    for text, field in (
        ("workload: {seed: " + "9" * 5000 + "}", "workload.seed"),
        ("workload: {burstiness: .inf}", "workload.burstiness"),
        ("workload: {request_rate: .nan}", "workload.request_rate"),
    ):
        with pytest.raises(rs.SpecError) as refused:
            rs.loads_spec(BASE + text)
        assert refused.value.errors[0]["field"] == field


def test_the_cli_names_the_field_before_submitting(tmp_path: Any) -> None:
    from servebench.cli import ServebenchError, read_spec_text

    path = tmp_path / "spec.yaml"
    path.write_text(BASE + "workload: {input_len: 1:30}\n", encoding="utf-8")
    with pytest.raises(ServebenchError, match=r"workload\.input_len: 1:30 is the number 90"):
        read_spec_text(str(path))


def test_aliases_are_still_refused() -> None:
    with pytest.raises(Exception, match="aliases"):
        rs.safe_yaml("a: &x [1]\nb: *x\n")


def test_presets_round_trip_through_the_reader() -> None:
    for name in sorted(rs.PRESETS):
        spec = rs.preset(name)
        assert rs.loads_spec(rs.dump_spec(spec)) == spec


# --------------------------------------------------------------------------- anchors


def _endpoint(**fields: Any) -> dict[str, Any]:
    backend = {"kind": "endpoint", "name": "prod", "base_url": "http://h.example:8000", **fields}
    return {"model": {"id": "org/m"}, "backends": [backend]}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_endpoint(base_url="http://h.example:8000\n"), "backends.0.base_url"),
        (_endpoint(base_url="http://h.example:8000/\n"), "backends.0.base_url"),
        (_endpoint(api_key={"env": "PROD_KEY\n"}), "backends.0.api_key.env"),
        (_endpoint(api_key={"secret": "prod-key\n"}), "backends.0.api_key.secret"),
        (_endpoint(api_key={"secret": "k", "key": "api-key\n"}), "backends.0.api_key.key"),
        (_endpoint(lora_modules=["a\n"]), "backends.0.lora_modules"),
        ({"model": {"id": "org/m\n"}}, "model.id"),
        ({"model": {"id": "org/m", "revision": "main\n"}}, "model.revision"),
        ({"model": {"id": "org/m"}, "name": "run\n"}, "name"),
        ({"model": {"id": "org/m"}, "name": "abc\u202edef"}, "name"),
        ({"model": {"id": "org/m"}, "backends": [{"kind": "vllm", "name": "v\n"}]},
         "backends.0.name"),
    ],
)  # fmt: skip
def test_a_trailing_newline_or_an_override_is_not_part_of_a_valid_value(
    data: dict[str, Any], field: str
) -> None:
    with pytest.raises(rs.SpecError) as refused:
        rs.parse_spec(data)
    assert refused.value.errors[0]["field"] == field, refused.value.errors


# --------------------------------------------------------------------------- json_problem


@pytest.mark.parametrize(
    ("value", "where", "why"),
    [
        ({"a": {"k\ud800": 1}}, "a.k\\ud800", "lone surrogate"),
        ({"k\r\n": 1}, "k\\x0d\\x0a", "control characters"),
        ({"x": {"\u202eevil": 1}}, "x.\\u202eevil", "bidirectional"),
        ({"k\x00": 1}, "k\\x00", "control characters"),
        ({"a": ["\ud800"]}, "a.0", "lone surrogate"),
        ({"a": rs.DuplicateKeys({"b": 1})}, "a.", "given twice"),
    ],
)
def test_json_problem_names_a_path_safe_to_echo(value: Any, where: str, why: str) -> None:
    problem = rs.json_problem(value)
    assert problem is not None and problem[0] == where and why in problem[1], problem
    problem[0].encode("utf-8")  # encodable: a response can carry it


def test_shown_and_renderable_leave_printable_text_alone() -> None:
    assert rs.shown("Qwen/Qwen3 é") == "Qwen/Qwen3 é"
    assert rs.shown("a\tb\u2066") == "a\\x09b\\u2066"
    assert rs.renderable("line\nnext \ud800") == "line\nnext \\ud800"


# --------------------------------------------------------------------------- numbers


def _measurement(**changes: Any) -> dict[str, Any]:
    point = {"key": "single", "sweep": "single", "input_len": 8, "output_len": 8,
             "max_concurrency": 1, "num_prompts": 1}  # fmt: skip
    return {
        "backend": "vllm",
        "backend_kind": "vllm",
        "point": point,
        "repeat": 0,
        "status": "succeeded",
        "started_at": "2026-11-30T00:00:00+00:00",
        "finished_at": "2026-11-30T00:00:01+00:00",
        "duration_s": 1.0,
        **changes,
    }


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"gpu_memory_peak_bytes": -1}, "gpu_memory_peak_bytes"),
        ({"duration_s": -1.0}, "duration_s"),
        ({"metrics": {"mean_ttft_ms": -0.1}}, "metrics.mean_ttft_ms"),
        ({"metrics": {"output_throughput": float("inf")}}, "metrics.output_throughput"),
        ({"metrics": {"output_throughput": float("nan")}}, "metrics.output_throughput"),
        ({"server_metrics": {"prefix_cache_hit_rate": 1.2}},
         "server_metrics.prefix_cache_hit_rate"),
        ({"server_metrics": {"samples": -3}}, "server_metrics.samples"),
        ({"point": {**_measurement()["point"], "num_prompts": -1}}, "point.num_prompts"),
    ],
)  # fmt: skip
def test_a_measurement_number_that_cannot_be_is_refused(
    changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Measurement.model_validate(_measurement(**changes))
    assert field in [e["field"] for e in rs.errors_from(refused.value)]


def test_events_count_forward_and_fingerprints_are_hex() -> None:
    for body, field in (
        ({"type": "progress", "done": -1}, "done"),
        ({"type": "started", "total": -4}, "total"),
        ({"type": "environment", "fingerprint": "abc\n"}, "fingerprint"),
        ({"type": "environment", "fingerprint": "ABC"}, "fingerprint"),
    ):
        with pytest.raises(ValidationError) as refused:
            Event.model_validate(body)
        assert [e["field"] for e in rs.errors_from(refused.value)] == [field]
    assert Event(type="environment", fingerprint="ab" * 32).fingerprint == "ab" * 32


def test_what_the_runner_measures_still_validates() -> None:
    assert ServerMetrics(preemptions=0, kv_cache_usage_peak=1.0, samples=3).samples == 3
    Measurement.model_validate(_measurement(metrics={"output_throughput": 0.0}))
