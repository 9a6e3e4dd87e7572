"""Endpoint backends, chat, realistic traffic and LoRA in the spec, and what they become:
the bench client's flags (read back by vLLM's own parser), the server's flags, the
request adapter for servers that take only OpenAI fields, and where keys come from.

No server here (test_endpoints.py has them); vLLM's parsers are real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runners import endpoint
from runners.bench_client import openai_only
from runners.fingerprint import FINGERPRINT_VERSION, configuration_fingerprint, fingerprint
from runners.spec import SpecError, parse_spec
from runners.vllm_bench import bench_command, bench_flags, request_facts
from runners.vllm_server import serve_flags

M = {"id": "org/model", "max_model_len": 4096}
PROD = {
    "kind": "endpoint",
    "name": "prod",
    "base_url": "http://vllm.prod.svc.cluster.local:8000",
    "model": "qwen3",
    "api_key": {"env": "PROD_KEY"},
}


def spec_of(**data: Any):
    return parse_spec({"model": M, "backends": [PROD], **data})


@pytest.fixture(scope="module")
def bench_parser(have_vllm):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser


@pytest.fixture(scope="module")
def serve_parser(have_vllm):
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


# --------------------------------------------------------------------------- the spec


def test_existing_specs_keep_their_fingerprints():
    """Fields added for endpoints, traffic, LoRA and the SLA search stay out of the dumps
    (and so out of every stored fingerprint) until a spec sets them. These hashes are
    those of FINGERPRINT_VERSION 3 (the measurement identity of issue 23, whose migration
    recomputed stored runs); a deliberate change bumps the version and re-pins them here."""
    assert FINGERPRINT_VERSION == 3
    plain = parse_spec({"model": {"id": "Qwen/Qwen3-0.6B"}})
    mixed = parse_spec(
        {
            "model": {"id": "/m", "max_model_len": 512},
            "workload": {"input_len": 64, "output_len": 16, "num_prompts": 16, "request_rate": 2},
            "sweeps": [
                {"name": "c", "axis": "max_concurrency", "values": [1, 4]},
                {"name": "r", "axis": "request_rate", "values": [1, 2]},
            ],
            "backends": [
                {"kind": "hf-sequential", "num_prompts": 2},
                {"kind": "vllm", "enable_prefix_caching": True, "max_num_seqs": 8},
                {"kind": "vllm", "name": "b", "kv_cache_dtype": "fp8"},
            ],
        }
    )
    assert fingerprint(plain) == "791062373d7672cba0d71fd625b2e5a2fd4d0e3b2aa568fd34fabe5eb5a30cd7"
    assert fingerprint(mixed) == "b8703ebb7dcdf95a09ba4fb24b76087441119db90f817aa5bc957a0926bb0896"
    assert "sla_search" not in plain.model_dump() and "top_k" not in plain.workload.model_dump()
    # The configuration under test (backends, model knobs) is hashed apart; new fields
    # stay out of it too until set...
    assert (
        configuration_fingerprint(plain)
        == "7405dd92099be1172cedebe4bd56a5aaecadd3119df08bd8fa38fecdb980676d"
    )
    assert (
        configuration_fingerprint(mixed)
        == "6849ce26ea8195fbc3807b4784f37c5e92ea90b52e4e7b44cbce19b87fb4c84d"
    )
    # ...and a spec that sets them is another configuration of the same measurement.
    chat = parse_spec(
        {"model": {"id": "Qwen/Qwen3-0.6B"}, "backends": [{"kind": "vllm", "api": "chat"}]}
    )
    completions = parse_spec({"model": {"id": "Qwen/Qwen3-0.6B"}, "backends": [{"kind": "vllm"}]})
    assert configuration_fingerprint(chat) != configuration_fingerprint(completions)


def test_a_spec_of_only_endpoints_needs_no_gpu():
    spec = spec_of()
    assert spec.resources.gpu_count == 0  # written into the spec as executed
    assert spec.total_measurements() == 1
    with pytest.raises(SpecError) as caught:
        spec_of(resources={"gpu_count": 1})
    assert caught.value.errors[0]["field"] == "resources.gpu_count"
    beside = parse_spec({"model": M, "backends": [PROD, {"kind": "vllm"}]})
    assert beside.resources.gpu_count == 1 and beside.total_measurements() == 2


def test_the_key_is_named_never_given():
    spec = spec_of()
    (prod,) = spec.endpoint_backends
    assert prod.key_env() == "PROD_KEY"
    assert "api_key" not in prod.server_config()  # not in the fingerprint either
    secret = parse_spec(
        {"model": M, "backends": [{**PROD, "api_key": {"secret": "prod-key", "key": "token"}}]}
    ).endpoint_backends[0]
    assert secret.key_env().startswith("SERVEBENCH_ENDPOINT_KEY_PROD_")
    a, b = (
        parse_spec({"model": M, "backends": [{**PROD, "name": n, "api_key": {"secret": "s"}}]})
        .endpoint_backends[0]
        .key_env()
        for n in ("a-b", "a_b")
    )
    assert a != b


def test_keys_are_taken_out_of_the_environment():
    spec = spec_of()
    environ = {"PROD_KEY": "sk-live-123", "OTHER": "x"}
    assert endpoint.take_keys(spec, environ) == {"prod": "sk-live-123"}
    assert environ == {"OTHER": "x"}  # no child inherits it
    assert endpoint.read_keys(spec, {}) == {}
    assert "PROD_KEY" in endpoint.missing_key_reason(spec.endpoint_backends[0])


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"base_url": "http://h:8000/v1"}, "backends.0.base_url", "leave /v1 out"),
        ({"base_url": "http://user:pw@h:8000"}, "backends.0.base_url", "credentials"),
        ({"base_url": "http://h:8000/?x=1"}, "backends.0.base_url", "without query"),
        ({"base_url": "ftp://h"}, "backends.0.base_url", "http(s)://"),
        ({"api_key": {"env": "A", "secret": "b"}}, "backends.0.api_key", "exactly one"),
        ({"api_key": {"env": "$(id)"}}, "backends.0.api_key.env", "variable name"),
        ({"api_key": "sk-live-123"}, "backends.0.api_key", "valid dictionary"),
        ({"model": "a b"}, "backends.0.model", "not allowed"),
    ],
    ids=["v1", "credentials", "query", "scheme", "two-keys", "env-name", "a-key", "model"],
)
def test_a_bad_endpoint_is_refused_naming_the_field(change, field, words):
    with pytest.raises(SpecError) as caught:
        parse_spec({"model": M, "backends": [{**PROD, **change}]})
    first = caught.value.errors[0]
    assert first["field"] == field, caught.value.errors
    assert words in first["message"]


@pytest.mark.parametrize(
    ("data", "field", "words"),
    [
        (
            {
                "workload": {"dataset": "prefix_repetition", "prefix_len": 256},
                "backends": [{"kind": "hf-sequential"}, {"kind": "vllm"}],
            },
            "backends.0.kind",
            "cannot send the prefix_repetition prompts",
        ),
        (
            {"workload": {"temperature": 0.8}, "backends": [{"kind": "hf-sequential"}, PROD]},
            "workload.temperature",
            "decodes greedily",
        ),
        (
            {
                "workload": {"dataset": "custom", "dataset_path": "/data/p.jsonl"},
                "backends": [{"kind": "hf-sequential"}, PROD, {**PROD, "name": "c", "api": "chat"}],
            },
            "backends.2.api",
            "the same api",
        ),
        (
            {"workload": {"dataset": "prefix_repetition"}, "backends": [PROD]},
            "workload.prefix_len",
            "prefix_len >= 1",
        ),
        (
            {"workload": {"dataset": "custom", "dataset_path": "/data/p.json"}, "backends": [PROD]},
            "workload.dataset_path",
            "ends in .jsonl",
        ),
        (
            {
                "workload": {"dataset": "prefix_repetition", "prefix_len": 8, "num_prompts": 4},
                "backends": [PROD],
            },
            "workload.num_prefixes",
            "every prefix needs a prompt",
        ),
        (
            {"workload": {"top_k": 20}, "backends": [{**PROD, "request_fields": "openai"}]},
            "workload.top_k",
            "not one",
        ),
        (
            {"workload": {"request_rate": 2, "ramp_up": {"start_rps": 1, "end_rps": 4}}},
            "workload.ramp_up",
            "leave request_rate out",
        ),
        (
            {
                "workload": {"ramp_up": {"start_rps": 1, "end_rps": 4}},
                "sweeps": [
                    {"name": "c", "axis": "max_concurrency", "values": [1, 2],
                     "fixed": {"request_rate": 3}},
                ],
            },
            "sweeps.0.fixed.request_rate",
            "leave request_rate out",
        ),
        (
            {"workload": {"ramp_up": {"strategy": "exponential", "start_rps": 0, "end_rps": 4}}},
            "workload.ramp_up.start_rps",
            "cannot start at 0",
        ),
        (
            {
                "backends": [
                    {"kind": "vllm", "lora_adapters": [{"name": "a", "path": "/l/a"}] * 2}
                ]
            },
            "backends.0.lora_adapters.1.name",
            "used twice",
        ),
        (
            {"backends": [{"kind": "vllm", "extra_args": ["--enable-lora"]}]},
            "backends.0.extra_args.0",
            "set lora_adapters instead",
        ),
    ],
    ids=[
        "hf-prefix-repetition", "hf-sampling", "hf-custom-mixed-api", "prefix-len",
        "jsonl", "num-prefixes", "top-k-openai", "ramp-and-rate", "ramp-and-fixed-rate",
        "ramp-zero", "lora-twice", "lora-flag",
    ],
)  # fmt: skip
def test_traffic_the_backends_cannot_share_is_refused_naming_the_field(data, field, words):
    with pytest.raises(SpecError) as caught:
        parse_spec({"model": M, **data})
    first = caught.value.errors[0]
    assert first["field"] == field, caught.value.errors
    assert words in first["message"]


def test_the_hf_baseline_runs_beside_the_same_custom_prompts():
    spec = parse_spec(
        {
            "model": M,
            "workload": {"dataset": "custom", "dataset_path": "/data/p.jsonl"},
            "backends": [{"kind": "hf-sequential"}, {**PROD, "api": "chat"}],
        }
    )
    from runners.hf_config import from_spec as hf_config

    config = hf_config(spec, spec.hf_backends[0])
    assert (config.prompts_file, config.chat_template) == ("/data/p.jsonl", True)
    assert config.flags()[-3:] == ["--prompts-file", "/data/p.jsonl", "--chat-template"]


# --------------------------------------------------------------------------- flags


def test_an_endpoint_is_asked_under_its_served_name_through_chat(bench_parser, tmp_path):
    spec = spec_of(
        backends=[{**PROD, "api": "chat", "lora_modules": ["a", "b"]}],
        workload={"temperature": 0.7, "top_p": 0.9, "top_k": 40, "num_prompts": 32},
    )
    backend = spec.endpoint_backends[0]
    (point,) = spec.points()
    args = bench_parser.parse_args(
        bench_flags(spec, point, backend.base_url, tmp_path / "r.json", backend)
    )
    assert (args.backend, args.endpoint) == ("openai-chat", "/v1/chat/completions")
    assert (args.base_url, args.model, args.served_model_name) == (
        "http://vllm.prod.svc.cluster.local:8000",
        "org/model",  # the tokenizer the client counts with
        "qwen3",
    )
    assert (args.temperature, args.top_p, args.top_k) == (0.7, 0.9, 40)
    assert (args.lora_modules, args.lora_assignment) == (["a", "b"], "random")
    assert args.ignore_eos
    command = bench_command(bench_flags(spec, point, backend.base_url, tmp_path / "r", backend))
    assert command.startswith("vllm bench serve --backend openai-chat")


def test_prefix_repetition_custom_and_ramp_up_use_the_clients_own_options(bench_parser, tmp_path):
    spec = parse_spec(
        {
            "model": M,
            "workload": {
                "dataset": "prefix_repetition",
                "prefix_len": 256,
                "num_prefixes": 4,
                "input_len": 32,
                "output_len": 8,
                "num_prompts": 16,
                "ramp_up": {"strategy": "linear", "start_rps": 1, "end_rps": 8},
            },
            "backends": [{"kind": "vllm", "api": "chat"}],
        }
    )
    (point,) = spec.points()
    assert point.max_concurrency == 16  # arrivals set the load, as under a rate
    args = bench_parser.parse_args(
        bench_flags(spec, point, "http://h:1", tmp_path / "r.json", spec.vllm_backends[0])
    )
    assert args.dataset_name == "prefix_repetition"
    assert (args.prefix_repetition_prefix_len, args.prefix_repetition_suffix_len) == (256, 32)
    assert (args.prefix_repetition_num_prefixes, args.prefix_repetition_output_len) == (4, 8)
    assert (args.ramp_up_strategy, args.ramp_up_start_rps, args.ramp_up_end_rps) == (
        "linear",
        1,
        8,
    )
    assert args.request_rate == float("inf")  # vLLM refuses a rate beside a ramp-up
    assert (args.backend, args.endpoint) == ("openai-chat", "/v1/chat/completions")

    custom = parse_spec(
        {
            "model": M,
            "workload": {"dataset": "custom", "dataset_path": "/data/p.jsonl", "output_len": 24},
            "backends": [PROD],
        }
    )
    (point,) = custom.points()
    args = bench_parser.parse_args(bench_flags(custom, point, "http://h:1", tmp_path / "r.json"))
    assert (args.dataset_name, args.dataset_path, args.custom_output_len) == (
        "custom",
        "/data/p.jsonl",
        24,
    )
    assert args.disable_shuffle and args.skip_chat_template  # file order; the server templates


def test_lora_adapters_are_served_with_the_base_model(serve_parser):
    spec = parse_spec(
        {
            "model": M,
            "backends": [
                {
                    "kind": "vllm",
                    "api": "chat",
                    "lora_adapters": [{"name": "a", "path": "/l/a"}, {"name": "b", "path": "o/b"}],
                    "max_lora_rank": 8,
                }
            ],
        }
    )
    backend = spec.vllm_backends[0]
    args = serve_parser.parse_args(["--model", "m", *serve_flags(spec, backend)])
    assert args.enable_lora and (args.max_loras, args.max_lora_rank) == (2, 8)
    modules = {m.name: m.path for m in args.lora_modules}
    assert modules == {"a": "/l/a", "b": "o/b"}
    # The API is a request setting: one server answers both, so it is not a server of its own.
    assert "api" not in backend.server_key() and backend.server_config()["api"] == "chat"


# --------------------------------------------------------------------------- the adapter


def test_the_adapter_sends_only_openai_fields():
    completions = {
        "model": "m",
        "prompt": "hi",
        "repetition_penalty": 1.0,
        "max_tokens": 8,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "top_k": 5,
        "temperature": 0.0,
    }
    assert openai_only(completions) == (
        ["ignore_eos", "logprobs", "repetition_penalty", "top_k"],
        [],
    )
    assert set(completions) == {
        "model",
        "prompt",
        "max_tokens",
        "stream",
        "stream_options",
        "temperature",
    }
    chat = {"model": "m", "messages": [], "max_completion_tokens": 8, "ignore_eos": True}
    assert openai_only(chat) == (["ignore_eos"], ["max_tokens"])
    assert chat["max_tokens"] == chat["max_completion_tokens"] == 8


def test_an_openai_only_endpoint_is_driven_through_the_adapter(bench_parser, tmp_path):
    spec = spec_of(backends=[{**PROD, "request_fields": "openai"}])
    backend = spec.endpoint_backends[0]
    (point,) = spec.points()
    flags = bench_flags(spec, point, backend.base_url, tmp_path / "r.json", backend)
    assert "--ignore-eos" not in flags  # it would be dropped anyway
    assert bench_command(flags, backend).startswith(
        "python -m runners.bench_client --openai-fields-only --backend openai "
    )
    detail = {"output_lens": [128, 100, 128, 0], "errors": ["", "", "", "boom"]}
    facts = request_facts(spec, backend, point, detail, {"dropped_fields": ["ignore_eos"]})
    assert facts["output_len"] == "not forced"
    assert (facts["short_responses"], facts["responses"]) == (1, 3)  # failed ones not counted
    assert "could not be forced" in facts["note"] and facts["dropped_fields"] == ["ignore_eos"]


def test_the_adapter_patches_the_function_every_request_body_passes(have_vllm):
    """If vLLM's client stops routing bodies through it, the adapter must fail loudly."""
    from vllm.benchmarks.lib import endpoint_request_func as erf

    source = Path(erf.__file__).read_text()
    for name in ("async_request_openai_completions", "async_request_openai_chat_completions"):
        body = source.split(f"async def {name}(", 1)[1].split("\nasync def ", 1)[0]
        assert "_update_payload_common(payload, request_func_input)" in body, name


def test_a_custom_prompt_file_reaches_the_hf_baseline_as_a_server_would_tokenize_it(
    tiny_model, tmp_path
):
    from transformers import AutoTokenizer

    from runners.hf import file_prompts

    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": p}) for p in ("first one", "second")) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    plain = file_prompts(tokenizer, str(path), 3, chat=False)
    assert [tokenizer.decode(ids) for ids in plain] == ["first one", "second", "first one"]
    chat = file_prompts(tokenizer, str(path), 1, chat=True)
    assert (
        tokenizer.decode(chat[0])
        == "<|im_start|>user\nfirst one<|im_end|>\n<|im_start|>assistant\n"
    )
