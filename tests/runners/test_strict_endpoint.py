"""An endpoint that accepts only OpenAI fields: ``transformers serve`` answers 422 to any
field it does not know, and vLLM's bench client always sends some (repetition_penalty,
ignore_eos). ``request_fields: openai`` drives the same client through its request
adapter; the measurement says that output lengths could not be forced, and how many
responses came back shorter (or longer) than asked.

``transformers serve`` on CPU starts in seconds (it needs ``accelerate``). Its continuous
batching sizes its KV cache from the machine's memory (18 GB here before the kernel killed
it), so the cache is capped.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from runners import procs
from runners.result import ResultDocument
from runners.runner import ExitCode, Runner
from runners.spec import parse_spec
from runners.vllm_server import free_port

# Its slow tests assert nothing a busy CPU changes: make test runs them beside others.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("have_vllm"), pytest.mark.shares_cpu]


@pytest.fixture(scope="module")
def strict_server(tiny_model: Path, tmp_path_factory: Any, need: Any) -> Iterator[str]:
    need(
        importlib.util.find_spec("accelerate") is not None,
        "accelerate (transformers serve requires it)",
        "it is pinned in requirements/dev.lock: rebuild the venv with scripts/venv.sh",
    )
    work = tmp_path_factory.mktemp("transformers-serve")
    (work / "hub").mkdir()  # its model list scans a hub cache, and fails without one
    port = free_port()
    argv = [
        sys.executable, "-m", "transformers.cli.transformers", "serve", str(tiny_model),
        "--continuous-batching", "--cb-num-blocks", "128", "--cb-block-size", "32",
        "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    log = work / "server.log"
    proc = procs.spawn(argv, log, env=procs.python_env({"HF_HUB_CACHE": str(work / "hub")}))
    base_url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            assert proc.poll() is None, f"transformers serve exited:\n{procs.tail(log)}"
            try:
                if requests.get(f"{base_url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        else:
            raise AssertionError(f"transformers serve did not start:\n{procs.tail(log)}")
        yield base_url
    finally:
        procs.stop(proc)


def test_a_server_that_takes_only_openai_fields_is_measured(strict_server, tiny_model, tmp_path):
    endpoint = {"kind": "endpoint", "base_url": strict_server}
    spec = parse_spec(
        {
            "model": {"id": str(tiny_model), "max_model_len": 1024},
            "workload": {
                "input_len": 32,
                "output_len": 16,
                "num_prompts": 8,
                "num_warmups": 1,
                "max_concurrency": 2,
            },
            "backends": [
                {**endpoint, "name": "strict", "request_fields": "openai"},
                {**endpoint, "name": "strict-chat", "request_fields": "openai", "api": "chat"},
                {**endpoint, "name": "as-vllm"},
            ],
        }
    )
    out = tmp_path / "result.json"
    code = Runner(spec, workdir=tmp_path / "work", out=out).run()
    document = ResultDocument.model_validate_json(out.read_text())
    by = {m.backend: m for m in document.measurements}
    strict, chat, as_vllm = by["strict"], by["strict-chat"], by["as-vllm"]

    assert code == ExitCode.FAILED  # as-vllm: refused, as it must be
    assert as_vllm.status == "failed"
    assert "422" in as_vllm.error and "repetition_penalty" in as_vllm.error
    assert "set request_fields: openai" in as_vllm.error

    for m in (strict, chat):
        assert m.status == "succeeded", m.error
        assert m.metrics["completed"] == 8
        facts = m.raw["servebench"]
        assert facts["output_len"] == "not forced" and facts["request_fields"] == "openai"
        assert "ignore_eos" in facts["dropped_fields"]
        assert "output lengths could not be forced" in facts["note"]
        # The limit held: no response ran past it (chat reads it as max_tokens here).
        assert facts["long_responses"] == 0
        assert facts["short_responses"] == sum(n < 16 for n in m.detail["output_lens"])
        assert m.metrics["total_output_tokens"] == sum(m.detail["output_lens"])
    assert "repetition_penalty" in strict.raw["servebench"]["dropped_fields"]
    assert chat.raw["servebench"]["added_fields"] == ["max_tokens"]
    assert strict.commands["bench"].startswith(
        "python -m runners.bench_client --openai-fields-only --backend openai "
    )
    facts = document.environment["endpoints"]["strict"]
    assert (facts["engine"], facts["metrics_exposed"], facts["gpu"]) == (
        "unknown",
        False,
        "unknown",
    )
