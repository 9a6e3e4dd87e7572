"""vLLM's bench client output -> Measurement fields, on outputs recorded from vLLM 0.32.

Also checks that every flag the runner passes is one vLLM's own parsers accept with the
meaning intended, and that the HF baseline's metric definitions reproduce vLLM's
numbers from the same per-request timings.
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest

from runners.latency import client_metrics
from runners.result import LATENCY_KEYS, METRIC_KEYS
from runners.spec import (
    ALLOWED_EXTRA_FLAGS,
    FIELD_FLAGS,
    SLO,
    Point,
    Spec,
    SpecError,
    VLLMBackend,
    parse_spec,
)
from runners.vllm_bench import bench_flags, client_failure, split_result
from runners.vllm_server import serve_flags

DATA = Path(__file__).parent / "data"
DETAILED = json.loads((DATA / "vllm-0.32-bench-serve-c8-detailed.json").read_text())
SUMMARY = json.loads((DATA / "vllm-0.32-bench-serve-c4.json").read_text())


def test_a_detailed_result_splits_into_metrics_raw_and_detail():
    metrics, raw, detail = split_result(DETAILED)
    assert metrics["output_throughput"] == DETAILED["output_throughput"]
    assert metrics["completed"] == 32 and metrics["failed"] == 0
    assert set(metrics) <= set(METRIC_KEYS)
    assert "request_goodput" not in metrics  # null in the file: absent, never zero
    assert {"mean_ttft_ms", "p99_itl_ms", "median_e2el_ms", "std_tpot_ms"} <= set(metrics)
    assert not any(isinstance(v, list) for v in raw.values())
    assert "generated_texts" not in raw and "generated_texts" not in detail
    assert raw["max_concurrency"] == 8 and raw["request_rate"] == "inf"
    assert {"input_lens", "output_lens", "ttfts", "itls", "latencies", "errors"} <= set(detail)
    assert all(len(v) == 32 for v in detail.values())
    assert client_failure(DETAILED) is None


def test_a_summary_result_keeps_its_remaining_arrays_out_of_raw():
    metrics, raw, detail = split_result(SUMMARY)
    assert metrics["total_output_tokens"] == 1024
    assert set(detail) == {"latencies", "queue_times"}
    assert "latencies" not in raw
    assert client_failure(SUMMARY) is None


def test_a_run_where_every_request_failed_is_a_failure_with_the_errors():
    broken = {
        **DETAILED,
        "completed": 0,
        "failed": 32,
        "output_throughput": 0.0,
        "errors": ["Bad Request: prompt too long"] * 31 + ["Connection reset"],
    }
    reason = client_failure(broken)
    assert reason.startswith("32 of 32 requests failed; errors: ")
    assert "Bad Request: prompt too long | Connection reset" in reason
    assert reason.count("prompt too long") == 1  # deduplicated


def test_a_failed_requests_traceback_is_said_as_its_exception():
    """vLLM's client records an exception as its whole traceback; the first 300
    characters of it were frames, with the cause cut off."""
    frames = "".join(
        f'  File "/venv/lib/python3.11/site-packages/aiohttp/client.py", line {n}, in _request\n'
        f"    await resp.start(conn)\n"
        for n in range(8)
    )
    traceback = (
        f"Traceback (most recent call last):\n{frames}"
        "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected\n"
    )
    some = {**DETAILED, "completed": 9, "failed": 1, "errors": ["", traceback]}
    assert client_failure(some) == (
        "1 of 10 requests failed; errors: "
        "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected"
    )


def test_a_few_failed_requests_fail_the_point():
    some = {**DETAILED, "completed": 30, "failed": 2, "errors": ["", "", "timeout", "timeout"]}
    assert client_failure(some) == "2 of 32 requests failed; errors: timeout"
    assert client_failure({"completed": 0, "failed": 0, "num_prompts": 8}) == (
        "no request completed (the client recorded no error text; see its log)"
    )


def test_hf_metric_definitions_reproduce_vllms_numbers():
    d = DETAILED
    ours = client_metrics(
        input_lens=d["input_lens"],
        output_lens=d["output_lens"],
        ttfts=d["ttfts"],
        itls=d["itls"],
        latencies=d["latencies"],
        duration=d["duration"],
    )
    assert set(ours) == set(METRIC_KEYS) - {"request_goodput"}
    compared = [k for k in LATENCY_KEYS if k in d] + [
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "total_input_tokens",
        "total_output_tokens",
    ]
    assert len(compared) == 21
    for key in compared:
        assert math.isclose(ours[key], d[key], rel_tol=1e-9), key


# --------------------------------------------------------------------------- flags


def _spec(**backend) -> Spec:
    return parse_spec(
        {
            "model": {"id": "/models/tiny", "max_model_len": 2048, "trust_remote_code": True},
            "workload": {
                "input_len": 128,
                "output_len": 32,
                "range_ratio": 0.25,
                "prefix_len": 16,
                "num_prompts": 40,
                "num_warmups": 3,
                "seed": 7,
                "burstiness": 0.5,
            },
            "backends": [{"kind": "vllm", **backend}],
            "resources": {"gpu_count": 2},
        }
    )


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


def test_bench_flags_mean_what_the_spec_says(bench_parser, tmp_path):
    spec = _spec().model_copy(update={"slo": SLO(ttft_ms=500, tpot_ms=50)})
    point = Point(
        sweep="rate",
        axis="request_rate",
        value=2.5,
        input_len=256,
        output_len=64,
        max_concurrency=16,
        num_prompts=40,
        request_rate=2.5,
    )
    flags = bench_flags(spec, point, "http://127.0.0.1:1234", tmp_path / "r.json")
    args = bench_parser.parse_args(flags)
    assert (args.dataset_name, args.random_input_len, args.random_output_len) == (
        "random",
        256,
        64,
    )
    assert (args.random_range_ratio, args.random_prefix_len) == ("0.25", 16)
    assert (args.num_prompts, args.max_concurrency, args.request_rate) == (40, 16, 2.5)
    assert (args.burstiness, args.seed, args.num_warmups) == (0.5, 7, 3)
    assert args.temperature == 0 and args.ignore_eos and args.trust_remote_code
    assert args.percentile_metrics == "ttft,tpot,itl,e2el"
    assert args.metric_percentiles == "50,90,99"
    assert args.goodput == ["ttft:500", "tpot:50"]
    assert args.save_result and args.save_detailed
    assert (args.result_dir, args.result_filename) == (str(tmp_path), "r.json")
    assert (args.base_url, args.backend, args.model) == (
        "http://127.0.0.1:1234",
        "vllm",
        "/models/tiny",
    )


def test_an_unlimited_rate_is_passed_as_inf(bench_parser, tmp_path):
    spec = _spec()
    (point,) = spec.points()
    args = bench_parser.parse_args(bench_flags(spec, point, "http://h:1", tmp_path / "r.json"))
    assert args.request_rate == float("inf")


def test_serve_flags_mean_what_the_spec_says(serve_parser):
    spec = _spec(
        gpu_memory_utilization=0.8,
        kv_cache_dtype="fp8",
        max_num_seqs=64,
        tensor_parallel_size=2,
        speculative_config={"method": "ngram", "num_speculative_tokens": 4},
        max_num_batched_tokens=4096,
        extra_args=["--no-enable-chunked-prefill"],
    )
    backend = spec.vllm_backends[0]
    args = serve_parser.parse_args(["--model", "/models/tiny", *serve_flags(spec, backend)])
    assert args.enable_prefix_caching is False  # explicit, whatever the release's default
    assert (args.dtype, args.max_model_len, args.kv_cache_dtype) == ("bfloat16", 2048, "fp8")
    assert (args.gpu_memory_utilization, args.max_num_seqs) == (0.8, 64)
    assert args.tensor_parallel_size == 2 and args.trust_remote_code
    assert args.max_num_batched_tokens == 4096 and args.enable_chunked_prefill is False
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 4}


def test_prefix_caching_on_is_explicit_too(serve_parser):
    spec = _spec(enable_prefix_caching=True)
    args = serve_parser.parse_args(["--model", "m", *serve_flags(spec, spec.vllm_backends[0])])
    assert args.enable_prefix_caching is True


def test_the_reproduce_command_is_the_server_that_runs(serve_parser, tmp_path):
    from runners.vllm_server import VLLMServer

    spec = _spec(enable_prefix_caching=True)
    server = VLLMServer(spec, spec.vllm_backends[0], tmp_path / "log")
    words = shlex.split(server.command())
    assert words[:4] == ["VLLM_SERVER_DEV_MODE=1", "vllm", "serve", "/models/tiny"]
    typed = serve_parser.parse_args(["--model", words[3], *words[4:]])
    assert typed == serve_parser.parse_args(server.argv()[3:])


def test_server_config_groups_ignore_names_and_timeouts():
    from runners.runner import server_groups

    spec = parse_spec(
        {
            "model": {"id": "m"},
            "backends": [
                {"kind": "vllm", "name": "a"},
                {"kind": "vllm", "name": "b", "startup_timeout_s": 60},
                {"kind": "vllm", "name": "c", "enable_prefix_caching": True},
            ],
        }
    )
    groups = server_groups(spec)
    assert [[b.name for b in g] for g in groups] == [["a", "b"], ["c"]]
    assert isinstance(groups[0][0], VLLMBackend)


# --------------------------------------------------------------------------- extra_args


def test_every_flag_extra_args_may_name_is_a_real_vllm_serve_flag(serve_parser):
    known = set(serve_parser._option_string_actions)
    assert known >= ALLOWED_EXTRA_FLAGS, sorted(ALLOWED_EXTRA_FLAGS - known)
    assert set(FIELD_FLAGS) <= known, sorted(set(FIELD_FLAGS) - known)


RUNNER_OWNED = {
    "host": "127.0.0.1",
    "port": 1234,
    "api_key": None,
    "served_model_name": None,
    "trust_remote_code": False,
    "tensor_parallel_size": 1,
    "dtype": "bfloat16",
}


def test_nothing_extra_args_accept_reaches_what_the_runner_or_a_field_sets(serve_parser):
    """Under vLLM's own parser (prefixes, '_' for '-'), every allowed flag, with a value
    where it takes one, leaves the address, key, model name, remote code and the fields'
    flags as the runner and the spec set them."""
    for flag in sorted(ALLOWED_EXTRA_FLAGS):
        action = serve_parser._option_string_actions[flag]
        value = [] if action.nargs == 0 else [str(action.choices[0]) if action.choices else "1"]
        args = [flag.replace("-", "_").replace("__", "--", 1), *value]
        spec = _spec(extra_args=args)
        spec = spec.model_copy(update={"resources": spec.resources.model_copy(
            update={"gpu_count": 4})})  # fmt: skip
        parsed = serve_parser.parse_args(
            ["--model", "m", "--host", "127.0.0.1", "--port", "1234",
             *serve_flags(spec, spec.vllm_backends[0])]
        )  # fmt: skip
        for name, expected in RUNNER_OWNED.items():
            if name == "trust_remote_code":
                expected = spec.model.trust_remote_code
            assert getattr(parsed, name) == expected, (flag, name)


@pytest.mark.parametrize(
    ("arg", "reaches"),
    [
        ("--ho=0.0.0.0", ("host", "0.0.0.0")),  # noqa: S104 - the danger shown
        ("--por=80", ("port", 80)),
        ("--api_k=x", ("api_key", ["x"])),
        ("--served=x", ("served_model_name", ["x"])),
        ("--trust-remote", ("trust_remote_code", True)),
    ],
)
def test_prefixes_vllm_would_expand_are_refused(serve_parser, arg, reaches):
    parsed = serve_parser.parse_args(["--model", "m", arg])
    assert getattr(parsed, reaches[0]) == reaches[1]  # what vLLM would have done with it
    with pytest.raises(SpecError):
        _spec(extra_args=[arg])
