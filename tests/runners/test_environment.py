"""Environment capture on this machine and secret filtering (fingerprint: test_fingerprint.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from runners.envfacts import lookup as get
from runners.environment import (
    REQUIRED_FIELDS,
    capture,
    local_model_hash,
    relevant_env,
)
from runners.spec import tiny_demo


@pytest.fixture(scope="module")
def spec(tiny_model):
    return tiny_demo(str(tiny_model))


@pytest.fixture(scope="module")
def env(spec):
    return capture(spec)


def test_no_required_field_is_empty(env):
    for field in REQUIRED_FIELDS:
        value = get(env, field)
        assert value is not None and value != "" and value != [], field


def test_gpu_fields_describe_this_machine(env):
    """ "none" without a GPU (this CPU machine); real values where NVML sees one."""
    gpu = env["gpu"]
    if shutil.which("nvidia-smi") is None:
        assert (gpu["model"], gpu["count"], gpu["driver_version"]) == ("none", 0, "none")
        assert gpu["memory_total_mib"] == "none" and gpu["cuda_driver_version"] == "none"
    else:
        assert gpu["count"] >= 1 and gpu["model"] != "none"
        assert isinstance(gpu["memory_total_mib"], int) and gpu["driver_version"] != "none"


def test_it_records_versions_model_identity_and_knobs(env, tiny_model):
    assert env["software"]["vllm"] != "not installed"
    assert env["software"]["torch"].startswith("2.")
    assert env["model"]["revision"] == f"sha256:{local_model_hash(tiny_model)}"
    assert env["model"]["revision_source"] == "local"
    assert env["model"]["config"] == {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        "dtype": "bfloat16",
        "tie_word_embeddings": True,
        "sliding_window": None,
    }
    bench = env["benchmark"]
    assert bench["concurrency"] == [1, 4, 16]
    assert (bench["input_len"], bench["output_len"], bench["ignore_eos"]) == ([128], [32], True)
    vllm = bench["backends"][1]
    assert vllm["prefix_caching"] is False and vllm["speculative_decoding"] == "none"
    assert env["packages"]["pydantic"]


def test_a_hub_model_offline_is_recorded_as_unresolved_not_an_error():
    env = capture(tiny_demo("no-such-org/no-such-model"))
    assert env["model"]["revision_source"] == "unresolved"
    assert env["model"]["revision"] == "main"


def test_secrets_never_reach_the_environment():
    kept = relevant_env(
        {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "HF_TOKEN": "hf_abcdefghijklmnop",
            "HF_HUB_OFFLINE": "1",
            "SERVEBENCH_RUN_TOKEN": "sb_run_abcdefghijkl",
            "SERVEBENCH_NOTE": "sb_run_abcdefghijkl",
            "VLLM_API_KEY": "x",
            "NCCL_SOCKET_IFNAME": "eth0",
            "AWS_SECRET_ACCESS_KEY": "x",
            "DB_PASSWORD": "x",
            "HOME": "/root",
        }
    )
    assert kept == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_HUB_OFFLINE": "1",
        "NCCL_SOCKET_IFNAME": "eth0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }


def test_kubernetes_and_image_come_from_the_downward_api(spec, monkeypatch):
    monkeypatch.setenv("SERVEBENCH_NODE_NAME", "gpu-node-3")
    monkeypatch.setenv("SERVEBENCH_POD_NAME", "run-abc")
    monkeypatch.setenv("SERVEBENCH_POD_NAMESPACE", "bench")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("SERVEBENCH_IMAGE", "ghcr.io/x/runner:1")
    env = capture(spec)
    assert env["kubernetes"] == {
        "in_cluster": True,
        "node": "gpu-node-3",
        "pod": "run-abc",
        "namespace": "bench",
    }
    assert env["container"] == {"image": "ghcr.io/x/runner:1", "image_digest": "none"}


def test_the_local_hash_changes_with_the_config(tiny_model, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(tiny_model, copy)
    assert local_model_hash(copy) == local_model_hash(tiny_model)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    assert local_model_hash(copy) != local_model_hash(tiny_model)


def test_the_env_command_prints_json(tiny_model, tmp_path):
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(tiny_demo(str(tiny_model)).model_dump_json())
    out = subprocess.run(
        [sys.executable, "-m", "runners", "env", str(spec_file)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    data = json.loads(out)
    assert len(data["fingerprint"]) == 64
    assert data["environment"]["model"]["revision_source"] == "local"
