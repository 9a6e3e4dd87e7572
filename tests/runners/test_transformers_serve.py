"""The ``transformers-serve`` backend: Transformers' own server, started and stopped by the
runner, measured by vLLM's bench client through the ``--transformers-fields`` adapter.

The tiny model rarely ends an answer early, so the forcing is tested on a copy whose
end-of-sequence token is the token it generates most often: asked without the adapter's
``generation_config`` that copy ends answers early; through the runner every answer is as
long as asked, with continuous batching and without (continuous batching drops
``min_new_tokens``; ``eos_token_id: -1`` is what forces both).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import requests

from runners import bench_client, procs
from runners.result import ResultDocument
from runners.runner import ExitCode, Runner
from runners.spec import SpecError, TransformersServeBackend, parse_spec
from runners.transformers_server import TransformersServer
from runners.vllm_bench import bench_flags

# Its slow tests assert nothing a busy CPU changes: make test runs them beside others.
pytestmark = pytest.mark.shares_cpu

OUTPUT_LEN = 24
PROMPTS = [" ".join(f"w{7 * i + j}" for j in range(20)) for i in range(12)]


def _spec(model: Path | str, **backend: Any) -> dict[str, Any]:
    return {
        "model": {"id": str(model), "max_model_len": 512},
        "workload": {
            "input_len": 48,
            "output_len": OUTPUT_LEN,
            "num_prompts": 8,
            "num_warmups": 1,
        },
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1, 4]}],
        "backends": [{"kind": "transformers-serve", "cb_num_blocks": 64, **backend}],
        "resources": {"gpu_count": 0},
    }


# --------------------------------------------------------------------------- no server


def test_the_adapter_carries_vllms_own_fields_in_a_generation_config():
    payload = {
        "model": "m",
        "prompt": "hi",
        "max_tokens": 8,
        "temperature": 0.0,
        "repetition_penalty": 1.0,
        "ignore_eos": True,
        "top_k": 5,
        "logprobs": None,
        "stream": True,
    }
    dropped, added = bench_client.transformers_fields(payload)
    assert json.loads(payload.pop("generation_config")) == {
        "do_sample": False,
        "eos_token_id": -1,
        "top_k": 5,
    }
    assert set(payload) == {"model", "prompt", "max_tokens", "temperature", "stream"}
    assert dropped == ["logprobs"] and added == ["generation_config"]
    # Sampled, no top_k: transformers' own default (50) must not apply; natural lengths.
    payload = {"model": "m", "messages": [], "max_completion_tokens": 4, "temperature": 0.7}
    _, added = bench_client.transformers_fields(payload)
    assert json.loads(payload["generation_config"]) == {"do_sample": True, "top_k": 0}
    assert payload["max_tokens"] == 4 and set(added) == {"max_tokens", "generation_config"}


def test_a_last_chunk_with_usage_is_read_as_vllm_sends_it():
    usage = {"completion_tokens": 3, "prompt_tokens": 2, "total_tokens": 5}
    last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
    parts = bench_client.split_usage("data: " + json.dumps(last), seen=True)
    assert [json.loads(p.removeprefix("data: ")) for p in parts] == [
        {"choices": [], "usage": usage}
    ]
    # A response with no chunk before it keeps its choices: its one event.
    parts = bench_client.split_usage("data: " + json.dumps(last), seen=False)
    assert [bool(json.loads(p.removeprefix("data: "))["choices"]) for p in parts] == [True, False]
    # Text in the last chunk stays a token event, without the usage.
    with_text = {"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": usage}
    parts = bench_client.split_usage("data: " + json.dumps(with_text), seen=True)
    first, second = (json.loads(p.removeprefix("data: ")) for p in parts)
    assert "usage" not in first and first["choices"][0]["delta"]["content"] == "x"
    assert second == {"choices": [], "usage": usage}
    assert bench_client.split_usage("data: [DONE]", seen=True) == ["data: [DONE]"]


def test_the_spec_refuses_what_transformers_serve_cannot_take(tiny_model):
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(tiny_model, continuous_batching=False))
    assert err.value.errors[0]["field"] == "backends.0.cb_num_blocks"
    assert "continuous_batching: true" in err.value.errors[0]["message"]
    spec = _spec(tiny_model)
    spec["model"]["tokenizer"] = "other/tokenizer"
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert err.value.errors[0]["field"] == "model.tokenizer"
    parsed = parse_spec(_spec(tiny_model, name="ts", compile=True))
    (backend,) = parsed.transformers_backends
    assert parsed.served_backends == [backend] and parsed.loads_model
    assert parsed.total_measurements() == 2
    flags = bench_flags(parsed, parsed.points()[0], "http://h:1", Path("r.json"), backend)
    assert flags[:2] == ["--backend", "openai"] and "--ignore-eos" in flags


# --------------------------------------------------------------------------- real servers


@pytest.fixture(scope="module")
def early_eos_model(tiny_model: Path, tmp_path_factory: Any) -> Path:
    """The tiny model with the token it generates most often as its end of sequence."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = tmp_path_factory.mktemp("early-eos") / "model"
    shutil.copytree(tiny_model, target)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    counts: collections.Counter[int] = collections.Counter()
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            out = model.generate(
                ids, max_new_tokens=OUTPUT_LEN, min_new_tokens=OUTPUT_LEN, do_sample=False
            )
            counts.update(out[0, ids.shape[1] :].tolist())
    eos = counts.most_common(1)[0][0]
    for name in ("config.json", "generation_config.json"):
        data = json.loads((target / name).read_text())
        data["eos_token_id"] = eos
        (target / name).write_text(json.dumps(data))
    return target


def _completion_tokens(base_url: str, model: str, prompt: str, **extra: Any) -> int:
    body = {"model": model, "prompt": prompt, "max_tokens": OUTPUT_LEN, "temperature": 0.0}
    answer = requests.post(f"{base_url}/v1/completions", json=body | extra, timeout=120)
    answer.raise_for_status()
    return int(answer.json()["usage"]["completion_tokens"])


@pytest.mark.slow
def test_the_server_ends_early_unless_the_adapter_forces_the_length(early_eos_model, tmp_path):
    spec = parse_spec(_spec(early_eos_model))
    (backend,) = spec.transformers_backends
    server = TransformersServer(spec, backend, tmp_path / "server.log")
    with server:
        assert server.alive
        natural = [_completion_tokens(server.base_url, str(early_eos_model), p) for p in PROMPTS]
        forced = []
        for prompt in PROMPTS:
            body = {"prompt": prompt, "max_tokens": OUTPUT_LEN, "ignore_eos": True}
            body |= {"temperature": 0.0, "repetition_penalty": 1.0}
            bench_client.transformers_fields(body)
            forced.append(_completion_tokens(server.base_url, str(early_eos_model), **body))
        pid = server.pid
    assert min(natural) < OUTPUT_LEN, natural  # this model does end answers early
    assert forced == [OUTPUT_LEN] * len(PROMPTS)
    assert pid is not None and not procs.group_alive(pid)  # the process group is gone


@pytest.mark.slow
@pytest.mark.parametrize("batching", [True, False], ids=["continuous-batching", "one-at-a-time"])
def test_the_runner_measures_it_at_every_point_with_forced_lengths(
    early_eos_model, tmp_path, batching
):
    extra = {} if batching else {"continuous_batching": False, "cb_num_blocks": None}
    spec = parse_spec(_spec(early_eos_model, name="ts", **extra))
    out = tmp_path / "result.json"
    code = Runner(spec, workdir=tmp_path / "work", out=out).run()
    document = ResultDocument.model_validate_json(out.read_text())
    assert code == ExitCode.OK, document.errors
    assert [m.point.key for m in document.measurements] == [p.key for p in spec.points()]
    for m in document.measurements:
        assert (m.backend_kind, m.status) == ("transformers-serve", "succeeded"), m.error
        assert m.metrics["completed"] == 8
        assert m.metrics["total_output_tokens"] == 8 * OUTPUT_LEN
        facts = m.raw["servebench"]
        assert facts["output_len"] == "forced" and facts["request_fields"] == "transformers"
        assert facts["length_check"]["checked"] == 9  # the warm-up too
        assert facts["length_check"]["differing"] == 0
        assert facts["stream"]["tokens"] == 9 * OUTPUT_LEN
        assert "generation_config" in facts["added_fields"]
        serve = m.commands["serve"]
        assert serve.startswith(f"transformers serve {early_eos_model} --host 127.0.0.1")
        flag = "--continuous-batching" if batching else "--no-continuous-batching"
        assert flag in serve and "--device cpu" in serve
        assert m.commands["bench"].startswith(
            "python -m runners.bench_client --transformers-fields"
        )
    (settings,) = document.environment["benchmark"]["backends"]
    assert settings["continuous_batching"] is batching
    assert settings["serving_packages"]["transformers"] != "not installed"
    assert "server_startup_s.ts" in document.timings


@pytest.mark.slow
def test_a_server_that_cannot_start_fails_its_points_with_its_own_words(tmp_path):
    missing = tmp_path / "no-such-model"
    missing.mkdir()
    spec = parse_spec(_spec(missing, startup_timeout_s=120))
    out = tmp_path / "result.json"
    code = Runner(spec, workdir=tmp_path / "work", out=out).run()
    document = ResultDocument.model_validate_json(out.read_text())
    assert code == ExitCode.FAILED
    assert len(document.measurements) == 2
    for m in document.measurements:
        assert m.status == "failed" and m.backend_kind == "transformers-serve"
        assert "transformers serve exited with code" in m.error
    assert os.path.exists(tmp_path / "work" / "server-transformers-serve.log")


def test_the_backends_options_have_defaults_a_cpu_run_can_use():
    backend = TransformersServeBackend()
    assert backend.continuous_batching and not backend.compile
    assert backend.server_config()["api"] == "completions"
