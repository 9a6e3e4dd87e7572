"""The two identities (runners.fingerprint) on a real captured environment: what a run
measured decides whether two runs compare; what it put under test is the change judged."""

from __future__ import annotations

import json

import pytest

from runners.environment import capture
from runners.fingerprint import (
    Identity,
    configuration,
    configuration_fingerprint,
    differences,
    fingerprint,
    measurement,
    quality_note,
)
from runners.spec import Spec, tiny_demo


@pytest.fixture(scope="module")
def spec(tiny_model) -> Spec:
    return tiny_demo(str(tiny_model))


@pytest.fixture(scope="module")
def env(spec):
    return capture(spec)


def variant(spec: Spec, **changes) -> Spec:
    """The spec with fields changed, validated again as a submitted one would be."""
    data = spec.model_dump(mode="json")
    for dotted, value in changes.items():
        node = data
        *path, last = dotted.split(".")
        for part in path:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = value
    return Spec.model_validate(data)


def test_what_does_not_change_what_is_measured_keeps_the_fingerprint(spec, env):
    base = fingerprint(spec, env)
    assert len(base) == 64
    assert base == fingerprint(spec, json.loads(json.dumps(env)))
    same = [
        variant(spec, name="another name", description="why", repeats=3),
        variant(spec, **{"resources.timeout_minutes": 90, "resources.image": "x/runner:2"}),
        variant(spec, slo={"ttft_ms": 100}),
        variant(spec, **{"backends.1.startup_timeout_s": 60}),
        variant(spec, **{"backends.0.name": "baseline", "backends.1.name": "vllm-main"}),
        spec.model_copy(update={"backends": list(reversed(spec.backends))}),
        # What is under test changes; what was measured does not: still comparable.
        variant(spec, **{"model.dtype": "float16"}),
        variant(spec, **{"model.max_model_len": 1024}),
        variant(spec, **{"backends.1.enable_prefix_caching": True}),
        variant(spec, **{"backends.1.max_num_seqs": 1}),
        variant(spec, **{"backends.0.num_prompts": 4}),
    ]
    for other in same:
        assert fingerprint(other, env) == base, other
    upgraded = {**env, "software": {**env["software"], "vllm": "9.9.9", "torch": "9.0"}}
    assert fingerprint(spec, upgraded) == base  # a new release stays in the series
    other_rev = {**env, "model": {**env["model"], "revision": "sha256:other"}}
    assert fingerprint(spec, other_rev) == base


def test_what_changes_the_measurement_changes_the_fingerprint(spec, env):
    base = fingerprint(spec, env)
    different = {
        "output_len": variant(spec, **{"workload.output_len": 64}),
        "seed": variant(spec, **{"workload.seed": 1}),
        "warm-ups": variant(spec, **{"workload.num_warmups": 1}),
        "sweep": variant(spec, **{"sweeps.0.values": [1, 4, 32]}),
    }
    for why, other in different.items():
        assert fingerprint(other, env) != base, why
    other_gpu = {**env, "gpu": {**env["gpu"], "model": "NVIDIA H100 80GB HBM3", "count": 1}}
    assert fingerprint(spec, other_gpu) != base
    more_gpus = {**env, "gpu": {**env["gpu"], "count": 8}}
    assert fingerprint(spec, more_gpus) != base


def test_what_is_under_test_changes_the_configuration_fingerprint(spec, env):
    base = configuration_fingerprint(spec, env)
    assert base != fingerprint(spec, env)
    different = {
        "dtype": variant(spec, **{"model.dtype": "float16"}),
        "context": variant(spec, **{"model.max_model_len": 1024}),
        "prefix caching": variant(spec, **{"backends.1.enable_prefix_caching": True}),
        "max_num_seqs": variant(spec, **{"backends.1.max_num_seqs": 1}),
        "hf prompts": variant(spec, **{"backends.0.num_prompts": 4}),
    }
    for why, other in different.items():
        assert configuration_fingerprint(other, env) != base, why
    other_rev = {**env, "model": {**env["model"], "revision": "sha256:other"}}
    assert configuration_fingerprint(spec, other_rev) != base
    # Names, order and timeouts are not the configuration; software is listed, not hashed.
    renamed = variant(spec, **{"backends.0.name": "baseline", "backends.1.name": "vllm-main"})
    assert configuration_fingerprint(renamed, env) == base
    upgraded = {**env, "software": {**env["software"], "vllm": "9.9.9"}}
    assert configuration_fingerprint(spec, upgraded) == base
    assert configuration_fingerprint(spec, env) == configuration_fingerprint(
        spec, json.loads(json.dumps(env))
    )


def test_differences_name_each_fact(spec, env):
    a = measurement(spec, env)
    b = measurement(variant(spec, **{"workload.seed": 7, "sweeps.0.values": [1, 4, 32]}), env)
    found = [str(d) for d in differences(a, b)]
    assert found[0] == "workload.seed: 0 vs 7"
    assert found[-2:] == [
        "points[concurrency:max_concurrency=16]: present vs —",
        "points[concurrency:max_concurrency=32]: — vs present",
    ]
    assert differences(a, measurement(spec, json.loads(json.dumps(env)))) == []


def test_a_change_is_named_as_a_reader_says_it(spec, env):
    base = Identity.of(spec, env)
    changed = variant(spec, **{"backends.1.max_num_seqs": 1, "model.dtype": "float16"})
    upgraded = {**env, "software": {**env["software"], "vllm": "0.33.1"}}
    other = Identity.of(changed, upgraded)
    assert base.comparable_with(other)
    assert base.differences(other) == []
    assert [d.change for d in base.changes(other)] == [
        "model.dtype: bfloat16 → float16",
        "vllm.max_num_seqs: default → 1",
        f"vLLM: {env['software']['vllm']} → 0.33.1",
    ]
    assert base.changes(Identity.of(spec, json.loads(json.dumps(env)))) == []
    assert "quality of the answers is not measured" in quality_note(base, other)
    slower = Identity.of(variant(spec, **{"backends.1.max_num_seqs": 1}), env)
    assert quality_note(base, slower) == ""  # a scheduling flag: the same answers
    fp8 = Identity.of(variant(spec, **{"backends.1.kv_cache_dtype": "fp8"}), env)
    assert "vllm.kv_cache_dtype" in quality_note(base, fp8)


def test_before_the_environment_the_spec_stands_in(spec, env):
    queued = measurement(spec)
    assert configuration(spec)["model"]["revision"] == ""  # requested: none
    assert queued["gpu"] == {"type": "", "count": spec.resources.gpu_count}
    found = measurement(spec, env)
    assert configuration(spec, env)["model"]["revision"].startswith("sha256:")  # its content
    gpu = env["gpu"]
    expected = "" if gpu["model"] in ("none", "unknown") else gpu["model"]
    assert found["gpu"] == {"type": expected, "count": gpu["count"]}  # what the runner found
    h100 = variant(spec, **{"resources.gpu_type": "H100-80GB", "resources.gpu_count": 1})
    assert measurement(h100)["gpu"] == {"type": "H100-80GB", "count": 1}
