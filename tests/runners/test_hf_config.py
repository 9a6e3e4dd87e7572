"""The HF baselines' configuration: spec -> config -> flags -> config, one rule.

The commands below are the ones the runner ran and the run page showed before the rule
was gathered into one module (``runners.hf_config``): people paste them, and stored runs
carry them, so they must not change. The runner's configuration, the portal's implied
command and the child's argument parser must all agree with them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from portal.benchmarks import commands
from runners import cli, hf_baselines, hf_config
from runners.spec import parse_spec

REPO = Path(__file__).resolve().parents[2]
M = {"id": "org/model", "max_model_len": 4096}
ENDPOINT = {"kind": "endpoint", "name": "prod", "base_url": "http://h:8000", "model": "m"}

SPECS: dict[str, dict[str, Any]] = {
    "defaults": {"model": M, "backends": [{"kind": "hf-sequential"}]},
    "varied": {
        "model": {
            **M,
            "dtype": "float16",
            "revision": "abc123",
            "tokenizer": "org/tok",
            "trust_remote_code": True,
        },
        "workload": {"seed": 7, "input_len": 64, "output_len": 16},
        "backends": [
            {
                "kind": "hf-sequential",
                "num_prompts": 4,
                "num_warmups": 2,
                "input_len": 32,
                "attn_implementation": "sdpa",
            }
        ],
    },
    "static": {
        "model": {**M, "dtype": "float32"},
        "workload": {"seed": 3},
        "backends": [
            {
                "kind": "hf-static-cache",
                "compile_backend": "aot_eager",
                "num_warmups": 0,
                "output_len": 8,
            }
        ],
    },
    "batched": {
        "model": {**M, "dtype": "auto"},
        "workload": {"seed": 11, "num_prompts": 8},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1, 4]}],
        "backends": [{"kind": "hf-batched", "attn_implementation": "eager"}],
    },
    "custom-chat": {
        "model": M,
        "workload": {"dataset": "custom", "dataset_path": "/data/p.jsonl", "num_prompts": 8},
        "backends": [
            {"kind": "hf-sequential"},
            {"kind": "hf-batched"},
            {**ENDPOINT, "api": "chat"},
        ],
        "resources": {"gpu_count": 0},
    },
}

SEQ = "python -m runners hf --model org/model"
BASE = "python -m runners.hf_baselines"
# (spec, backend, point key) -> the command, as the runner ran it before the move.
PINNED = {
    ("defaults", "hf-sequential", "baseline"): (
        f"{SEQ} --dtype bfloat16 --input-len 1024 --output-len 128 --num-prompts 16 "
        "--num-warmups 1 --seed 0"
    ),
    ("varied", "hf-sequential", "baseline"): (
        f"{SEQ} --revision abc123 --tokenizer org/tok --attn-implementation sdpa "
        "--dtype float16 --input-len 32 --output-len 16 --num-prompts 4 --num-warmups 2 "
        "--seed 7 --trust-remote-code"
    ),
    ("static", "hf-static-cache", "baseline"): (
        f"{BASE} static-cache --model org/model --dtype float32 --input-len 1024 "
        "--output-len 8 --num-prompts 16 --num-warmups 0 --seed 3 --compile-backend aot_eager"
    ),
    ("batched", "hf-batched", "concurrency:max_concurrency=1"): (
        f"{BASE} batched --model org/model --attn-implementation eager --dtype auto "
        "--input-len 1024 --output-len 128 --num-prompts 8 --num-warmups 1 --seed 11 "
        "--batch-size 1"
    ),
    ("batched", "hf-batched", "concurrency:max_concurrency=4"): (
        f"{BASE} batched --model org/model --attn-implementation eager --dtype auto "
        "--input-len 1024 --output-len 128 --num-prompts 8 --num-warmups 1 --seed 11 "
        "--batch-size 4"
    ),
    ("custom-chat", "hf-sequential", "baseline"): (
        f"{SEQ} --dtype bfloat16 --input-len 1024 --output-len 128 --num-prompts 16 "
        "--num-warmups 1 --seed 0 --prompts-file /data/p.jsonl --chat-template"
    ),
    ("custom-chat", "hf-batched", "single"): (
        f"{BASE} batched --model org/model --dtype bfloat16 --input-len 1024 "
        "--output-len 128 --num-prompts 8 --num-warmups 1 --seed 0 "
        "--prompts-file /data/p.jsonl --chat-template --batch-size 1"
    ),
}


def _case(spec_name: str, backend_name: str, point_key: str) -> tuple[Any, Any, Any]:
    spec = parse_spec(SPECS[spec_name])
    backend = next(b for b in spec.backends if b.name == backend_name)
    point = next((p for p in spec.points() if p.key == point_key), None)
    return spec, backend, point


def runner_config(spec: Any, backend: Any, point: Any) -> Any:
    """What the runner runs for ``backend`` at ``point``."""
    return hf_config.for_backend(spec, backend, point)


def parsed_back(config: Any) -> Any:
    """``config``'s flags read by the child's own argument parser (``python -m runners hf``
    or ``python -m runners.hf_baselines``)."""
    if isinstance(config, hf_config.HFConfig):
        args = cli.build_parser().parse_args(["hf", *config.flags()])
        return hf_config.config_from_args(args)
    args = hf_baselines.build_parser().parse_args(config.flags())
    return hf_config.baseline_from_args(args)


@pytest.mark.parametrize(("spec_name", "backend_name", "point_key"), list(PINNED))
def test_the_runner_and_the_page_build_todays_commands(spec_name, backend_name, point_key):
    spec, backend, point = _case(spec_name, backend_name, point_key)
    expected = PINNED[(spec_name, backend_name, point_key)]
    config = runner_config(spec, backend, point)
    assert config.command() == expected
    assert commands.hf_command(spec, backend, point) == expected
    assert commands.implied(spec, backend_name, point_key) == {"hf": expected}


@pytest.mark.parametrize(("spec_name", "backend_name", "point_key"), list(PINNED))
def test_the_childs_parser_reads_back_the_same_configuration(spec_name, backend_name, point_key):
    config = runner_config(*_case(spec_name, backend_name, point_key))
    assert parsed_back(config) == config


def test_the_child_owns_the_cores_the_runner_was_given_and_writes_its_result_there():
    spec, backend, point = _case("batched", "hf-batched", "concurrency:max_concurrency=4")
    config = hf_config.for_backend(spec, backend, point)
    argv = hf_config.child_argv(config, "/venv/bin/python", "/work/b-r0.json", cpus="2-5")
    assert argv[:3] == ["/venv/bin/python", "-m", "runners.hf_baselines"]
    assert argv[3:-4] == config.flags()
    assert argv[-4:] == ["--result", "/work/b-r0.json", "--cpus", "2-5"]
    # Without --cpus the child inherits the runner's affinity (or $SERVEBENCH_CPUS).
    spec, backend, _ = _case("varied", "hf-sequential", "baseline")
    config = hf_config.for_backend(spec, backend)
    argv = hf_config.child_argv(config, "python3", "r.json")
    assert argv == ["python3", "-m", "runners", "hf", *config.flags(), "--result", "r.json"]
    args = cli.build_parser().parse_args(argv[3:])
    assert hf_config.config_from_args(args) == config and args.result == "r.json"


def test_hf_batched_is_measured_at_a_sweep_point_only():
    spec, backend, _ = _case("batched", "hf-batched", "")
    with pytest.raises(ValueError, match="sweep point"):
        hf_config.for_backend(spec, backend)


def test_the_configuration_module_imports_no_torch_transformers_numpy_or_django():
    """The portal builds the commands from it: importing it must stay cheap."""
    heavy = ("torch", "transformers", "numpy", "django")
    code = (
        "import sys, runners.hf_config\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]", out.stdout
