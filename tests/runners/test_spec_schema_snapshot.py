"""The spec contract, pinned byte for byte: its JSON Schema, the presets as dumped YAML, the
specs the validators rewrite, and the errors of representative bad specs.

A change to any of them changes what users, stored runs and the portal see, so it must be
deliberate: these tests compare with files committed under ``tests/runners/data/`` and,
when the change is intended, are regenerated with::

    SERVEBENCH_UPDATE_SNAPSHOT=1 pytest tests/runners/test_spec_schema_snapshot.py

(then review and commit the changed files with the change that caused them).
"""

from __future__ import annotations

import difflib
import json
import os
from pathlib import Path
from typing import Any

import pytest

from runners import spec as rs

DATA = Path(__file__).parent / "data"
UPDATE = os.environ.get("SERVEBENCH_UPDATE_SNAPSHOT") == "1"
REGENERATE = (
    "If the change is intended, regenerate the snapshot with\n"
    "    SERVEBENCH_UPDATE_SNAPSHOT=1 pytest tests/runners/test_spec_schema_snapshot.py\n"
    "and commit {path} with the change."
)

M = {"id": "Qwen/Qwen3-0.6B"}
TINY_DIR = "models/tiny"


def check_snapshot(name: str, text: str) -> None:
    """``text`` equals the committed ``data/<name>``, or the test fails with a diff and how
    to regenerate it (SERVEBENCH_UPDATE_SNAPSHOT=1 writes it instead)."""
    path = DATA / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(
            f"no snapshot {path}.\n" + REGENERATE.format(path=path.relative_to(DATA.parents[2]))
        )
    expected = path.read_text(encoding="utf-8")
    if text == expected:
        return
    diff = "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            text.splitlines(keepends=True),
            f"committed {name}",
            "now",
        )
    )
    if len(diff) > 6000:
        diff = diff[:6000] + "\n... (diff cut)\n"
    pytest.fail(
        f"{name} no longer matches runners.spec:\n{diff}\n"
        + REGENERATE.format(path=path.relative_to(DATA.parents[2]))
    )


def as_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def test_the_json_schema_is_unchanged():
    check_snapshot("spec.schema.json", as_json(rs.json_schema()))


def preset_specs() -> dict[str, rs.Spec]:
    specs = {name: rs.preset(name) for name in sorted(rs.PRESETS)}
    specs[rs.TINY_DEMO] = rs.tiny_demo(TINY_DIR)
    return specs


# Specs the validators complete or rewrite (the spec as executed differs from the one sent).
REWRITTEN: dict[str, dict[str, Any]] = {
    "endpoint-only-asks-no-gpu": {
        "model": M,
        "backends": [{"kind": "endpoint", "base_url": "http://vllm.prod:8000/"}],
    },
    "rate-sweep-unlimited-concurrency": {
        "model": M,
        "workload": {"num_prompts": 40},
        "sweeps": [{"name": "rate", "axis": "request_rate", "values": [1, 2.5]}],
        "backends": [{"kind": "vllm"}],
    },
    "workload-rate-unlimited-concurrency": {
        "model": M,
        "workload": {"request_rate": 4, "num_prompts": 20},
        "backends": [{"kind": "vllm"}],
    },
    "sla-search-on-rate": {
        "model": M,
        "backends": [{"kind": "vllm"}],
        "sla_search": {
            "axis": "request_rate",
            "slo": {"p99_ttft_ms": 500},
            "low": 1,
            "high": 8,
            "fixed": {"num_prompts": 30},
        },
    },
    "whole-number-sweep-values": {
        "model": M,
        "sweeps": [{"name": "out", "axis": "output_len", "values": [16.0, 32.0]}],
    },
    "every-backend-kind": {
        "model": {**M, "revision": "main", "max_model_len": 2048},
        "workload": {"dataset": "custom", "dataset_path": "prompts.jsonl", "top_k": None},
        "backends": [
            {"kind": "hf-sequential", "num_prompts": 4},
            {"kind": "hf-static-cache", "compile_backend": "aot_eager"},
            {"kind": "hf-batched"},
            {
                "kind": "vllm",
                "lora_adapters": [{"name": "a", "path": "org/adapter"}],
                "extra_args": ["--max_logprobs", "5", "--seed=1"],
            },
            {
                "kind": "endpoint",
                "name": "ep",
                "base_url": "https://api.example.com/x",
                "api_key": {"secret": "ep-key"},
                "lora_modules": ["a"],
            },
            {"kind": "transformers-serve", "cb_num_blocks": 64},
        ],
        "resources": {"gpu_count": 2, "node_selector": {"pool": "gpu"}},
    },
}


# Specs of runs accepted earlier, read with parse_spec(stored=True): refusals added since
# are not applied again, and a search stored before ``confirm`` existed reads as 'none'.
STORED: dict[str, dict[str, Any]] = {
    "stored-hf-batched-under-a-rate": {
        "model": M,
        "sweeps": [{"name": "r", "axis": "request_rate", "values": [1]}],
        "backends": [{"kind": "hf-batched"}, {"kind": "vllm"}],
    },
    "stored-search-before-confirm": {
        "model": M,
        "backends": [{"kind": "vllm"}],
        "sla_search": {"axis": "max_concurrency", "slo": {"p99_tpot_ms": 50}, "low": 1, "high": 8},
    },
}


def test_the_presets_and_rewritten_specs_dump_as_before():
    parts = []
    for name, spec in preset_specs().items():
        parts.append(f"# preset {name}: {spec.total_measurements()} measurements\n")
        parts.append(rs.dump_spec(spec))
        parts.append("---\n")
    for name, data in REWRITTEN.items():
        spec = rs.parse_spec(data)
        points = ", ".join(p.key for p in spec.points())
        parts.append(f"# {name}: points {points}\n")
        parts.append(rs.dump_spec(spec))
        parts.append("---\n")
    for name, data in STORED.items():
        spec = rs.parse_spec(data, stored=True)
        parts.append(f"# {name}: {spec.total_measurements()} measurements\n")
        parts.append(rs.dump_spec(spec))
        parts.append("---\n")
    check_snapshot("spec.presets.yaml", "".join(parts))


def test_the_preset_json_dump_is_unchanged():
    dumps = {name: json.loads(rs.dump_spec(spec, "json")) for name, spec in preset_specs().items()}
    check_snapshot("spec.presets.json", as_json(dumps))


def vllm(*extra: str, **kw: Any) -> dict[str, Any]:
    return {"model": M, "backends": [{"kind": "vllm", "extra_args": list(extra), **kw}]}


# Representative bad specs, one or more per module of the spec's rules. The snapshot holds
# every error (field and message) and the SpecError's text.
INVALID: dict[str, Any] = {
    "not-a-mapping": ["model"],
    "unknown-field": {"model": M, "extra": 1},
    "unknown-nested-field": {"model": {**M, "size": "0.6B"}},
    "missing-model": {},
    "unsafe-model-id": {"model": {"id": "$(rm -rf /)"}},
    "nul-in-text": {"model": M, "name": "a\x00b"},
    "non-finite-number": {"model": M, "workload": {"request_rate": float("inf")}},
    "control-characters-in-name": {"model": M, "name": "a\nb"},
    "bad-extra-flag": vllm("--trust-remote-code-please"),
    "reserved-flag": vllm("--port", "8001"),
    "reserved-flag-prefix": vllm("--ho", "127.0.0.1"),
    "flag-with-a-field": vllm("--tensor-parallel-size", "2"),
    "extra-args-start-with-a-value": vllm("8"),
    "bad-parallel-size": vllm("--pipeline-parallel-size", "two"),
    "bad-sweep-axis": {
        "model": M,
        "sweeps": [{"name": "t", "axis": "temperature", "values": [0.5]}],
    },
    "sweep-pins-its-axis": {
        "model": M,
        "sweeps": [
            {"name": "c", "axis": "max_concurrency", "values": [1], "fixed": {"max_concurrency": 2}}
        ],
    },
    "fractional-concurrency": {
        "model": M,
        "sweeps": [{"name": "c", "axis": "max_concurrency", "values": [1.5]}],
    },
    "duplicate-sweep-names": {
        "model": M,
        "sweeps": [
            {"name": "c", "axis": "max_concurrency", "values": [1]},
            {"name": "c", "axis": "output_len", "values": [16]},
        ],
    },
    "tp-beyond-gpu-count": {
        "model": M,
        "backends": [{"kind": "vllm", "tensor_parallel_size": 4}],
        "resources": {"gpu_count": 2},
    },
    "dp-beyond-gpu-count": {
        "model": M,
        "backends": [{"kind": "vllm", "extra_args": ["--data-parallel-size=2"]}],
    },
    "duplicate-backend-names": {"model": M, "backends": [{"kind": "vllm"}, {"kind": "vllm"}]},
    "unknown-backend-kind": {"model": M, "backends": [{"kind": "sglang"}]},
    "duplicate-lora-adapters": vllm(
        lora_adapters=[{"name": "a", "path": "x/a"}, {"name": "a", "path": "x/b"}]
    ),
    "endpoint-url-with-credentials": {
        "model": M,
        "backends": [{"kind": "endpoint", "base_url": "http://u:p@host:8000"}],
    },
    "endpoint-url-with-v1": {
        "model": M,
        "backends": [{"kind": "endpoint", "base_url": "http://host:8000/v1"}],
    },
    "endpoint-key-both-ways": {
        "model": M,
        "backends": [
            {
                "kind": "endpoint",
                "base_url": "http://host:8000",
                "api_key": {"env": "KEY", "secret": "key"},
            }
        ],
    },
    "endpoint-only-with-gpus": {
        "model": M,
        "backends": [{"kind": "endpoint", "base_url": "http://host:8000"}],
        "resources": {"gpu_count": 1},
    },
    "openai-endpoint-with-top-k": {
        "model": M,
        "workload": {"top_k": 5},
        "backends": [
            {"kind": "endpoint", "base_url": "http://host:8000", "request_fields": "openai"}
        ],
    },
    "transformers-serve-with-tokenizer": {
        "model": {**M, "tokenizer": "other/tok"},
        "backends": [{"kind": "transformers-serve"}],
    },
    "transformers-serve-blocks-without-cb": {
        "model": M,
        "backends": [
            {"kind": "transformers-serve", "continuous_batching": False, "cb_block_size": 16}
        ],
    },
    "hf-with-sharegpt": {
        "model": M,
        "workload": {"dataset": "sharegpt", "dataset_path": "sg.json"},
    },
    "hf-with-sampling": {"model": M, "workload": {"temperature": 0.7}},
    "hf-batched-under-a-rate": {
        "model": M,
        "sweeps": [{"name": "r", "axis": "request_rate", "values": [1]}],
        "backends": [{"kind": "hf-batched"}, {"kind": "vllm"}],
    },
    "lengths-beyond-max-model-len": {
        "model": {**M, "max_model_len": 1024},
        "sweeps": [{"name": "p", "axis": "input_len", "values": [128, 1024]}],
        "backends": [{"kind": "vllm"}],
    },
    "hf-lengths-beyond-max-model-len": {
        "model": {**M, "max_model_len": 512},
        "workload": {"input_len": 128},
        "backends": [{"kind": "hf-sequential", "input_len": 500}],
    },
    "too-many-points": {
        "model": M,
        "repeats": 10,
        "sweeps": [{"name": "c", "axis": "max_concurrency", "values": list(range(1, 33))}],
    },
    "custom-dataset-not-jsonl": {
        "model": M,
        "workload": {"dataset": "custom", "dataset_path": "p.json"},
    },
    "ramp-up-reversed": {
        "model": M,
        "workload": {"ramp_up": {"start_rps": 5, "end_rps": 2}},
        "backends": [{"kind": "vllm"}],
    },
    "ramp-up-with-rate": {
        "model": M,
        "workload": {"request_rate": 2, "ramp_up": {"start_rps": 1, "end_rps": 2}},
        "backends": [{"kind": "vllm"}],
    },
    "sla-search-unknown-metric": {
        "model": M,
        "backends": [{"kind": "vllm"}],
        "sla_search": {"axis": "request_rate", "slo": {"p95_ttft_ms": 1}, "low": 1, "high": 2},
    },
    "sla-search-reversed-range": {
        "model": M,
        "backends": [{"kind": "vllm"}],
        "sla_search": {"axis": "max_concurrency", "slo": {"p99_ttft_ms": 1}, "low": 4, "high": 2},
    },
    "sla-search-unknown-backend": {
        "model": M,
        "backends": [{"kind": "vllm"}],
        "sla_search": {
            "axis": "max_concurrency",
            "slo": {"p99_ttft_ms": 1},
            "low": 1,
            "high": 4,
            "backends": ["other"],
        },
    },
    "empty-slo": {"model": M, "slo": {}},
    "unsafe-node-selector": {"model": M, "resources": {"node_selector": {"a b": "c"}}},
}

# Texts for loads_spec (YAML parsing and size refusals).
INVALID_TEXT: dict[str, str] = {
    "bad-yaml": "model: {id: [\n",
    "yaml-alias": "a: &x 1\nb: *x\n",
    "too-large": "#" * 1_000_001,
}


def errors(case: Any, *, text: bool = False) -> dict[str, Any]:
    with pytest.raises(rs.SpecError) as caught:
        rs.loads_spec(case) if text else rs.parse_spec(case)
    return {"text": str(caught.value), "errors": caught.value.errors}


def test_the_error_messages_are_unchanged():
    out = {name: errors(data) for name, data in INVALID.items()}
    out |= {name: errors(text, text=True) for name, text in INVALID_TEXT.items()}
    check_snapshot("spec.errors.json", as_json(out))
