"""The one definition of "comparable" (runners.fingerprint) on a real captured environment."""

from __future__ import annotations

import json

import pytest

from runners.environment import capture
from runners.fingerprint import components, differences, fingerprint
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
    ]
    for other in same:
        assert fingerprint(other, env) == base, other
    upgraded = {**env, "software": {**env["software"], "vllm": "9.9.9", "torch": "9.0"}}
    assert fingerprint(spec, upgraded) == base  # a new release stays in the series


def test_what_changes_the_measurement_changes_the_fingerprint(spec, env):
    base = fingerprint(spec, env)
    different = {
        "dtype": variant(spec, **{"model.dtype": "float16"}),
        "context": variant(spec, **{"model.max_model_len": 1024}),
        "output_len": variant(spec, **{"workload.output_len": 64}),
        "seed": variant(spec, **{"workload.seed": 1}),
        "sweep": variant(spec, **{"sweeps.0.values": [1, 4, 32]}),
        "prefix caching": variant(spec, **{"backends.1.enable_prefix_caching": True}),
        "hf prompts": variant(spec, **{"backends.0.num_prompts": 4}),
    }
    for why, other in different.items():
        assert fingerprint(other, env) != base, why
    other_gpu = {**env, "gpu": {**env["gpu"], "model": "NVIDIA H100 80GB HBM3", "count": 1}}
    assert fingerprint(spec, other_gpu) != base
    other_rev = {**env, "model": {**env["model"], "revision": "sha256:other"}}
    assert fingerprint(spec, other_rev) != base


def test_differences_name_each_fact(spec, env):
    a = components(spec, env)
    b = components(
        variant(
            spec,
            **{
                "model.dtype": "float16",
                "backends.1.kv_cache_dtype": "fp8",
                "sweeps.0.values": [1, 4, 32],
            },
        ),
        env,
    )
    found = [str(d) for d in differences(a, b)]
    assert found == [
        "model.dtype: bfloat16 vs float16",
        "points[concurrency:max_concurrency=16]: present vs —",
        "points[concurrency:max_concurrency=32]: — vs present",
        "backends[vllm].kv_cache_dtype: auto vs fp8",
    ]
    assert differences(a, components(spec, json.loads(json.dumps(env)))) == []


def test_before_the_environment_the_spec_stands_in(spec, env):
    queued = components(spec)
    assert queued["model"]["revision"] == ""  # requested: none
    assert queued["gpu"] == {"type": "", "count": spec.resources.gpu_count}
    found = components(spec, env)
    assert found["model"]["revision"].startswith("sha256:")  # a local directory's content
    gpu = env["gpu"]
    expected = "" if gpu["model"] in ("none", "unknown") else gpu["model"]
    assert found["gpu"] == {"type": expected, "count": gpu["count"]}  # what the runner found
    h100 = variant(spec, **{"resources.gpu_type": "H100-80GB", "resources.gpu_count": 1})
    assert components(h100)["gpu"] == {"type": "H100-80GB", "count": 1}
