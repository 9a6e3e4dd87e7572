"""hf-batched and hf-static-cache on the tiny model: real transformers generate() on CPU,
in-process and through the runner (child processes, the result document)."""

from __future__ import annotations

import json
import math

import pytest

from runners import hf_baselines as hb
from runners.hf import HFConfig
from runners.result import METRIC_KEYS
from runners.runner import Runner
from runners.spec import SpecError, parse_spec

# Its slow tests assert nothing a busy CPU changes: make test runs them beside others.
pytestmark = pytest.mark.shares_cpu

PROMPTS, INPUT_LEN, OUTPUT_LEN = 3, 24, 6


def _config(tiny_model, **kw) -> HFConfig:
    return HFConfig(
        model=str(tiny_model),
        input_len=INPUT_LEN,
        output_len=OUTPUT_LEN,
        num_prompts=PROMPTS,
        num_warmups=1,
        seed=3,
        **kw,
    )


@pytest.fixture(scope="module")
def batched(tiny_model):
    return hb.run(hb.BaselineConfig("batched", _config(tiny_model), batch_size=2))


@pytest.fixture(scope="module")
def static(tiny_model):
    # aot_eager: torch.compile for real (dynamo, AOT autograd) without inductor's C++
    # code generation, which takes minutes on two cores.
    config = hb.BaselineConfig("static-cache", _config(tiny_model), compile_backend="aot_eager")
    return hb.run(config)


def test_batched_runs_static_batches_of_the_concurrency(batched):
    m, d = batched.metrics, batched.detail
    assert set(m) == set(METRIC_KEYS) - {"request_goodput"}
    assert d["output_lens"] == [OUTPUT_LEN] * PROMPTS
    assert d["input_lens"] == [INPUT_LEN] * PROMPTS
    assert m["completed"] == PROMPTS and m["total_output_tokens"] == PROMPTS * OUTPUT_LEN
    assert batched.raw["batch_size"] == 2 and batched.raw["batches"] == 2
    # The two requests of the first batch share its start, first step and gaps.
    assert d["start_times"][0] == d["start_times"][1] < d["start_times"][2]
    assert d["ttfts"][0] == d["ttfts"][1]
    assert d["itls"][0] == d["itls"][1]
    assert [len(gaps) for gaps in d["itls"]] == [OUTPUT_LEN - 1] * PROMPTS
    assert math.isclose(m["output_throughput"], m["total_output_tokens"] / m["duration"])
    assert "python -m runners.hf_baselines batched" in batched.command
    assert "--batch-size 2" in batched.command


def test_static_cache_compiles_apart_from_the_measurement(static):
    m, raw = static.metrics, static.raw
    assert static.detail["output_lens"] == [OUTPUT_LEN] * PROMPTS
    assert m["completed"] == PROMPTS
    assert raw["cache_implementation"] == "static"
    assert raw["compile_backend"] == "aot_eager"
    assert raw["compile_s"] > 0
    # Sequential: one request after another inside the timed loop.
    assert sum(static.detail["latencies"]) <= m["duration"]
    assert "--compile-backend aot_eager" in static.command


def test_static_cache_compiles_every_prompt_length_before_the_timed_loop(tiny_model, tmp_path):
    # A custom prompt file: lengths vary, and a new shape can make torch.compile compile
    # again. Every length the loop sends is compiled (untimed) before it, and the loop
    # itself compiles nothing (its numbers hold no compile time).
    words = [f"word{i}" for i in range(16)]
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": " ".join(words[: 3 + 2 * i])}) + "\n" for i in range(5))
    )
    config = _config(tiny_model, prompts_file=str(path))
    result = hb.run(hb.BaselineConfig("static-cache", config, compile_backend="aot_eager"))
    lengths = result.detail["input_lens"]
    assert len(set(lengths)) == PROMPTS  # the loop's prompts differ in length
    assert set(lengths) <= set(result.raw["compiled_lengths"])
    assert result.raw["warm_shapes_s"] > 0 and result.raw["compile_s"] > 0
    assert result.raw["compiles_in_timed_loop"] == 0
    assert result.detail["output_lens"] == [OUTPUT_LEN] * PROMPTS


def test_the_compile_counter_counts_what_torch_compile_compiles():
    # What fails a static-cache measurement whose timed loop compiled: dynamo's own
    # compile callbacks, counted while entered and not after.
    import torch

    def f(x):
        return torch.sin(x) + 1

    compiled = torch.compile(f, backend="eager")
    with hb._Compiles() as counter:
        compiled(torch.ones(3))
        compiled(torch.ones(3))  # the same shape: no new compilation
    assert counter.count == 1
    compiled(torch.ones(3, 5))  # a new shape compiles again, outside the counter
    assert counter.count == 1
    # A CUDA graph recording fires the same callbacks (inductor's reduce-overhead mode):
    # not a compilation. Dispatched as torch dispatches it.
    from torch._dynamo.callback import CallbackArgs, CallbackTrigger, callback_handler

    with hb._Compiles() as counter:
        callback_handler.run_start_callbacks(
            CallbackArgs(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0")
        )
        callback_handler.run_start_callbacks(CallbackArgs(CallbackTrigger.DYNAMO, "1/0"))
    assert counter.count == 1


def test_the_baselines_send_the_sequential_loops_prompts(tiny_model):
    from runners import hf

    config = _config(tiny_model)
    tokenizer, model = hf._load(config, hf._device())
    prompts, _ = hb._prompts(config, tokenizer, model)
    vocab = min(len(tokenizer), model.get_input_embeddings().num_embeddings)
    same = hf.random_prompts(INPUT_LEN, vocab, set(tokenizer.all_special_ids), PROMPTS, 3)
    assert all((a == b).all() for a, b in zip(prompts, same, strict=True))


def test_left_padding_keeps_each_prompt_and_masks_the_pad():
    import torch

    ids, mask = hb._left_pad([torch.tensor([5, 6, 7]), torch.tensor([8])], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def _spec(tiny_model, **workload):
    return {
        "name": "baselines",
        "model": {"id": str(tiny_model), "max_model_len": 512},
        "workload": {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN, "num_prompts": 2} | workload,
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [2]}],
        "backends": [
            {"kind": "hf-static-cache", "num_prompts": 2, "compile_backend": "aot_eager"},
            {"kind": "hf-batched"},
        ],
        "resources": {"gpu_count": 0},
    }


def test_the_spec_counts_batched_points_and_keeps_the_prompt_rules(tiny_model):
    spec = parse_spec(_spec(tiny_model))
    assert [b.kind for b in spec.hf_backends] == ["hf-static-cache"]
    assert [b.kind for b in spec.batched_backends] == ["hf-batched"]
    assert spec.total_measurements() == 1 + len(spec.points())
    with pytest.raises(SpecError, match="greedily"):
        parse_spec(_spec(tiny_model, temperature=0.7) | {"backends": [{"kind": "hf-batched"}]})


@pytest.mark.slow
def test_through_the_runner_every_baseline_is_a_measurement(tiny_model, tmp_path):
    spec = parse_spec(_spec(tiny_model))
    out = tmp_path / "result.json"
    code = Runner(spec, workdir=tmp_path / "work", out=out).run()
    doc = json.loads(out.read_text())
    assert code == 0, doc["errors"]
    found = {(m["backend_kind"], m["point"]["key"]): m for m in doc["measurements"]}
    assert set(found) == {
        ("hf-static-cache", "baseline"),
        ("hf-batched", spec.points()[0].key),
    }
    for m in found.values():
        assert m["status"] == "succeeded"
        assert m["metrics"]["total_output_tokens"] == 2 * OUTPUT_LEN
    assert found["hf-static-cache", "baseline"]["raw"]["compile_s"] > 0
    assert found["hf-batched", spec.points()[0].key]["raw"]["batch_size"] == 2
    assert "runners.hf_baselines" in found["hf-batched", spec.points()[0].key]["commands"]["hf"]
    settings = doc["environment"]
    assert "hf-static-cache" in json.dumps(settings)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sweeps": [{"name": "rate", "axis": "request_rate", "values": [1, 4]}]}, "sweeps.0.axis"),
        ({"workload": {"request_rate": 4}}, "workload.request_rate"),
        ({"workload": {"ramp_up": {"start_rps": 1, "end_rps": 4}}}, "workload.ramp_up"),
        (
            {
                "sweeps": [
                    {"name": "c", "axis": "max_concurrency", "values": [2, 4]},
                    {
                        "name": "len",
                        "axis": "input_len",
                        "values": [8],
                        "fixed": {"request_rate": 2},
                    },
                ]
            },
            "sweeps.1.fixed.request_rate",
        ),
    ],
    ids=["rate-sweep", "rate", "ramp-up", "fixed-rate"],
)
def test_hf_batched_under_a_request_rate_is_refused_naming_the_field(tiny_model, change, field):
    # Static batches back to back cannot follow arrivals: under a rate its batch would be
    # every prompt at once, beside servers that got them at that rate.
    data = _spec(tiny_model)
    data = {
        **data,
        **change,
        "workload": {**data["workload"], **change.get("workload", {})},
        "backends": [{"kind": "hf-batched"}, {"kind": "vllm"}],
    }
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    first = caught.value.errors[0]
    assert first["field"] == field, caught.value.errors
    assert "hf-batched (backends.0)" in first["message"]
    assert "remove the hf-batched backend" in first["message"]
    # Without hf-batched the same traffic is a valid spec.
    parse_spec({**data, "backends": [{"kind": "vllm"}]})
    # A run stored before the rule keeps parsing, also where the spec rewrites itself
    # (an assignment re-validates it without the parse's context).
    stored = parse_spec(data, stored=True)
    stored.name = "renamed"
    assert [b.kind for b in stored.backends] == ["hf-batched", "vllm"]
