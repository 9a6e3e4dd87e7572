"""The spec contract: every bad spec names its field with a message a person can act on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runners.cli import main
from runners.spec import (
    SpecError,
    json_schema,
    loads_spec,
    parse_spec,
    preset,
    tiny_demo,
)

M = {"id": "Qwen/Qwen3-0.6B"}
UNSAFE = "contains characters that are not allowed"
VLLM = {"kind": "vllm"}


def sweep(**kw):
    return {"name": "c", "axis": "max_concurrency", "values": [1], **kw}


# (spec, field, a fragment of the message); the first error must match.
BAD_SPECS = [
    ({}, "model", "Field required"),
    ({"model": M, "extra": 1}, "extra", "unknown field"),
    ({"model": {**M, "dtype": "int4"}}, "model.dtype", "'int4' is not one of the choices: auto"),
    ({"model": {**M, "dtype": "bfloat61"}}, "model.dtype", "did you mean 'bfloat16'?"),
    (
        {"model": M, "backends": [{"kind": "hf-sequentail"}]},
        "backends.0.kind",
        "'hf-sequentail': did you mean 'hf-sequential'? The choices: hf-sequential, hf-static",
    ),
    ({"model": {"id": "Qwen/Qwen3 0.6B"}}, "model.id", UNSAFE),
    ({"model": {"id": "$(rm -rf /)"}}, "model.id", UNSAFE),
    ({"model": {"id": "m;reboot"}}, "model.id", UNSAFE),
    ({"model": {"id": "../../etc/passwd"}}, "model.id", "must not contain '..' path segments"),
    ({"model": {"id": ""}}, "model.id", "must not be empty"),
    ({"model": {**M, "revision": "main;ls"}}, "model.revision", UNSAFE),
    ({"model": {**M, "tokenizer": "a|b"}}, "model.tokenizer", UNSAFE),
    ({"model": {**M, "max_model_len": 10}}, "model.max_model_len", "greater than or equal to 64"),
    ({"model": {**M, "trust_remote_code": "maybe"}}, "model.trust_remote_code", "valid boolean"),
    (
        {"model": M, "workload": {"input_len": 0}},
        "workload.input_len",
        "greater than or equal to 1",
    ),
    (
        {"model": M, "workload": {"num_prompts": 0}},
        "workload.num_prompts",
        "greater than or equal to 1",
    ),
    ({"model": M, "workload": {"range_ratio": 1.0}}, "workload.range_ratio", "less than 1"),
    (
        {"model": M, "workload": {"dataset": "c4"}},
        "workload.dataset",
        "'c4' is not one of the choices: random, sharegpt, prefix_repetition, custom",
    ),
    (
        {"model": M, "workload": {"dataset": "sharegpt"}},
        "workload.dataset_path",
        "dataset_path is required when dataset is 'sharegpt'",
    ),
    (
        {"model": M, "workload": {"ignore_eos": False}},
        "workload.ignore_eos",
        "always generates exactly output_len tokens",
    ),
    (
        {"model": M, "workload": {"dataset_path": "x.json"}},
        "workload.dataset_path",
        "only used with dataset 'sharegpt'",
    ),
    ({"model": M, "workload": {"request_rate": 0}}, "workload.request_rate", "greater than 0"),
    ({"model": M, "workload": {"burstiness": 0}}, "workload.burstiness", "greater than 0"),
    ({"model": M, "workload": {"seed": -1}}, "workload.seed", "greater than or equal to 0"),
    (
        {"model": M, "workload": {"input_len": 4000}},
        "workload.input_len",
        "prefix_len + input_len + output_len = 4128 exceeds model.max_model_len 4096",
    ),
    (
        {"model": M, "sweeps": [{"name": "p", "axis": "input_len", "values": [128, 4000]}]},
        "sweeps.0.values",
        "point p:input_len=4000: prefix_len + input_len + output_len = 4128 exceeds",
    ),
    ({"model": M, "sweeps": [sweep(axis="temperature")]}, "sweeps.0.axis", "choices: max_"),
    ({"model": M, "sweeps": [sweep(values=[])]}, "sweeps.0.values", "at least 1 item"),
    ({"model": M, "sweeps": [sweep(values=[1, 1])]}, "sweeps.0.values", "must be unique"),
    ({"model": M, "sweeps": [sweep(values=[1.5])]}, "sweeps.0.values", "must be whole numbers"),
    ({"model": M, "sweeps": [sweep(values=[-1])]}, "sweeps.0.values", "must be positive"),
    ({"model": M, "sweeps": [sweep(values=list(range(1, 34)))]}, "sweeps.0.values", "at most 32"),
    ({"model": M, "sweeps": [sweep(name="c c")]}, "sweeps.0.name", "sweep name must be 1-63"),
    (
        {"model": M, "sweeps": [sweep(fixed={"max_concurrency": 2})]},
        "sweeps.0.fixed.max_concurrency",
        "'fixed' must not pin the swept axis max_concurrency",
    ),
    ({"model": M, "sweeps": [sweep(fixed={"seed": 2})]}, "sweeps.0.fixed.seed", "unknown field"),
    (
        {"model": M, "sweeps": [sweep(), sweep(axis="input_len")]},
        "sweeps.1.name",
        "sweep names must be unique: 'c'",
    ),
    (
        {"model": M, "sweeps": [sweep(name="baseline")]},
        "sweeps.0.name",
        "'baseline' is reserved",
    ),
    ({"model": M, "backends": []}, "backends", "at least 1 item"),
    ({"model": M, "backends": [{"kind": "tgi"}]}, "backends.0.kind", "'tgi' is not one of"),
    (
        {"model": M, "backends": [VLLM, VLLM]},
        "backends.1.name",
        "backend names must be unique: 'vllm' is also backends.0's name",
    ),
    (
        {"model": M, "backends": [{**VLLM, "gpu_memory_utilization": 1.5}]},
        "backends.0.gpu_memory_utilization",
        "less than or equal to 1",
    ),
    (
        {"model": M, "backends": [{**VLLM, "kv_cache_dtype": "int3"}]},
        "backends.0.kv_cache_dtype",
        "'int3' is not one of the choices: auto, fp8",
    ),
    ({"model": M, "backends": [{**VLLM, "unknown": 1}]}, "backends.0.unknown", "unknown field"),
    (
        {"model": M, "backends": [{**VLLM, "extra_args": ["--enable-chunked-prefill", "--port"]}]},
        "backends.0.extra_args.1",
        "extra argument '--port' is set by the runner",
    ),
    (
        {"model": M, "backends": [{**VLLM, "extra_args": ["--served-model-name=x"]}]},
        "backends.0.extra_args.0",
        "'--served-model-name' is set by the runner",
    ),
    (
        {"model": M, "backends": [{**VLLM, "extra_args": ["--x;rm"]}]},
        "backends.0.extra_args.0",
        f"extra argument 'x;rm' {UNSAFE}",
    ),
    (
        {"model": M, "backends": [{**VLLM, "quantization": "awq && ls"}]},
        "backends.0.quantization",
        UNSAFE,
    ),
    (
        {"model": M, "backends": [{**VLLM, "startup_timeout_s": 1}]},
        "backends.0.startup_timeout_s",
        "greater than or equal to 10",
    ),
    (
        {"model": M, "backends": [{"kind": "hf-sequential", "input_len": 4000}]},
        "backends.0.input_len",
        "backend 'hf-sequential': input_len + output_len = 4128 exceeds model.max_model_len",
    ),
    ({"model": M, "repeats": 0}, "repeats", "greater than or equal to 1"),
    ({"model": M, "repeats": 11}, "repeats", "less than or equal to 10"),
    ({"model": M, "slo": {}}, "slo", "an SLO needs at least one of ttft_ms, tpot_ms, e2el_ms"),
    ({"model": M, "slo": {"ttft_ms": -5}}, "slo.ttft_ms", "greater than 0"),
    (
        {"model": M, "resources": {"node_selector": {"gpu": "a b"}}},
        "resources.node_selector",
        f"node selector value 'a b' {UNSAFE}",
    ),
    ({"model": M, "resources": {"image": "img`id`"}}, "resources.image", UNSAFE),
    ({"model": M, "name": "a\nb"}, "name", "must not contain control characters"),
    ({"model": M, "version": 2}, "version", "Input should be 1"),
    (
        {
            "model": M,
            "sweeps": [sweep(name=f"s{i}", values=list(range(1, 33))) for i in range(8)],
        },
        "",
        "the spec expands to 257 measurements; the limit is 256",
    ),
    ([], "", "a spec must be a mapping"),
    (
        {"model": M, "workload": {"clients": 3, "max_concurrency": 4}, "sweeps": [sweep()]},
        "workload.clients",
        "workload.clients is 3 but point c:max_concurrency=1 keeps only 1 requests in flight",
    ),
    (
        {"model": M, "workload": {"clients": 4, "num_prompts": 3, "request_rate": 5}},
        "workload.clients",
        "sends only 3 prompts: each client needs at least one",
    ),
    (
        {"model": M, "workload": {"clients": 2, "dataset": "custom", "dataset_path": "p.jsonl"}},
        "workload.clients",
        "every client would send the file's same first prompts",
    ),
    ({"model": M, "workload": {"clients": 65}}, "workload.clients", "from 1 to 64, or 'auto'"),
    ({"model": M, "workload": {"clients": "many"}}, "workload.clients", "not 'many'"),
    (
        {"model": M, "workload": {"clients": "auto", "ramp_up": {"start_rps": 1, "end_rps": 4}}},
        "workload.clients",
        "workload.clients: auto cannot be used here (one client only): a ramp-up's",
    ),
]


@pytest.mark.parametrize(("data", "field", "message"), BAD_SPECS)
def test_it_rejects_a_bad_spec_naming_the_field(data, field, message):
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    first = caught.value.errors[0]
    assert first["field"] == field
    assert message in first["message"]


def test_the_seed_preset_is_the_seed_experiment_exactly():
    spec = preset("seed")
    assert (spec.model.id, spec.model.dtype, spec.model.max_model_len) == (
        "Qwen/Qwen3-0.6B",
        "bfloat16",
        4096,
    )
    w = spec.workload
    assert (w.input_len, w.output_len, w.num_prompts, w.ignore_eos, w.num_warmups) == (
        1024,
        128,
        256,
        True,
        8,
    )
    by_sweep: dict[str, list[tuple]] = {}
    for p in spec.points():
        by_sweep.setdefault(p.sweep, []).append((p.max_concurrency, p.input_len, p.output_len))
    assert by_sweep["concurrency"] == [(c, 1024, 128) for c in (1, 4, 16, 64)]
    assert by_sweep["prompt-length"] == [(64, 128, 128), (64, 1024, 128), (64, 2048, 128)]
    assert [o for _, _, o in by_sweep["output-length"]] == [32, 128, 512, 1024]
    assert all(p.num_prompts == 256 and p.request_rate is None for p in spec.points())
    (hf,) = spec.hf_backends
    assert (hf.input_len, hf.output_len) == (1024, 128)
    (vllm,) = spec.vllm_backends
    assert vllm.enable_prefix_caching is False
    assert spec.total_measurements() == 1 + 11


def test_yaml_errors_say_where():
    with pytest.raises(SpecError) as caught:
        loads_spec("model:\n  id: [unclosed\n")
    assert caught.value.errors[0]["message"].startswith("not valid YAML or JSON at line")


def test_a_spec_round_trips_through_json():
    spec = tiny_demo("/models/tiny")
    again = loads_spec(json.dumps(spec.model_dump(mode="json")))
    assert again == spec
    assert [p.key for p in again.points()] == [
        "concurrency:max_concurrency=1",
        "concurrency:max_concurrency=4",
        "concurrency:max_concurrency=16",
    ]


def test_the_schema_is_exported_from_the_model(capsys):
    schema = json_schema()
    assert schema["$schema"].endswith("2020-12/schema")
    assert schema["additionalProperties"] is False
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "Spec"


def test_validate_exits_2_and_names_every_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {id: 'a b'}\nrepeats: 0\nsurprise: 1\n")
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "model.id: model id 'a b' contains characters" in err
    assert "repeats: Input should be greater than or equal to 1" in err
    assert "surprise: unknown field" in err


def test_validate_accepts_a_good_spec(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("model: {id: Qwen/Qwen3-0.6B}\n")
    assert main(["validate", str(good)]) == 0
    assert capsys.readouterr().out.startswith("ok: 2 measurements")


def test_run_without_a_spec_or_token_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.delenv("SERVEBENCH_RUN_TOKEN", raising=False)
    assert main(["run"]) == 2
    assert main(["run", "--preset", "nope"]) == 2
    assert main(["run", "--preset", "seed", "--report", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'nope' is not one of the choices: " in err
    assert "--report needs a run token: set SERVEBENCH_RUN_TOKEN" in err


def test_runners_never_import_django():
    """The runner image has no Django; the portal is reached over HTTP only."""
    code = (
        "import sys, runners.cli, runners.runner, runners.hf, runners.vllm_bench, "
        "runners.environment; assert not [m for m in sys.modules if m.startswith('django')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_yaml_aliases_are_refused_so_a_tiny_spec_cannot_expand_to_gigabytes():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
    with pytest.raises(SpecError, match="not valid YAML"):
        loads_spec(bomb + "model: {id: org/m}\n")


def test_reserved_server_flags_are_refused_in_either_spelling():
    for flag in ("--api-key=x", "--api_key=x", "--served_model_name", "--port"):
        with pytest.raises(SpecError, match="is set by the runner"):
            parse_spec(
                {"model": {"id": "org/m"}, "backends": [{"kind": "vllm", "extra_args": [flag]}]}
            )
