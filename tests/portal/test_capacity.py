"""KV-cache arithmetic, the GPU table and the decode roofline (no database)."""

from __future__ import annotations

import pytest

from portal.benchmarks import capacity as cap

LLAMA_8B = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",
}


def test_the_seeds_worked_example() -> None:
    per_token = cap.kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)
    assert per_token == 131_072
    assert per_token * 8_192 == 2**30  # 8,192 tokens of context: 1 GiB


def test_kv_dtype_follows_the_cache_dtype_then_the_model_dtype() -> None:
    assert cap.dtype_bytes("fp8") == 1
    assert cap.dtype_bytes("auto", "bfloat16") == 2
    assert cap.dtype_bytes("auto", None, "torch.float32") == 4
    assert cap.dtype_bytes("auto", "mystery") is None


@pytest.mark.parametrize(
    ("name", "memory_mib", "key"),
    [
        ("NVIDIA A10G", 23028, "A10G"),
        ("NVIDIA A10", 23028, "A10"),
        ("NVIDIA L4", 23034, "L4"),
        ("NVIDIA L40S", 46068, "L40S"),
        ("NVIDIA L40", 46068, "L40"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 81920, "A100-80GB-PCIe"),
        ("NVIDIA A100-PCIE-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-SXM4", 81920, "A100-80GB"),  # told apart by its memory
        ("NVIDIA H100 80GB HBM3", 81559, "H100-SXM"),
        ("NVIDIA H100 PCIe", 81559, "H100-PCIe"),
        ("NVIDIA H100 NVL", 95830, "H100-NVL"),
        ("H100-80GB", None, "H100-SXM"),  # a spec's gpu_type
        ("NVIDIA H200", 143771, "H200"),
        ("NVIDIA GH200 480GB", 97871, "GH200"),
        ("NVIDIA B200", 183359, "B200"),
        ("Tesla T4", 15360, "T4"),
    ],
)
def test_gpu_names_as_nvidia_smi_writes_them(name: str, memory_mib: int | None, key: str) -> None:
    gpu = cap.lookup_gpu(name, memory_mib)
    assert gpu is not None and gpu.key == key


@pytest.mark.parametrize("name", ["CPU", "none", "", "AMD Instinct MI999", "NVIDIA GeForce GT 710"])
def test_unknown_gpus_are_none(name: str) -> None:
    assert cap.lookup_gpu(name) is None


def test_the_parameter_estimate_matches_known_models() -> None:
    shape = cap.ModelShape.from_config(LLAMA_8B)
    assert shape is not None
    assert shape.parameters() == pytest.approx(8.03e9, rel=0.01)  # Llama-3.1-8B
    qwen = cap.ModelShape.from_config(
        {
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "hidden_size": 1024,
            "intermediate_size": 3072,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
        }
    )
    assert qwen.parameters() == pytest.approx(0.596e9, rel=0.01)  # Qwen3-0.6B


def test_the_curve_facts() -> None:
    xs = [1, 2, 4, 8, 16, 32]
    assert cap.flattened_at(xs, [100, 190, 360, 650, 700, 720]) == 16  # +7.7% over 8
    assert cap.flattened_at(xs, [100, 200, 400, 800, 1600, 3200]) is None
    assert cap.preemptions_from(xs, [0, 0, 0, None, 3, 9]) == 16


def curve(tpot_ms: float = 20.0) -> list[dict]:
    return [
        {
            "x": c,
            "concurrency": c,
            "num_prompts": 256,
            "input_len": 1024,
            "output_len": 128,
            "output_throughput": 100.0 * c,
            "preemptions": 0,
            "mean_tpot_ms": tpot_ms,
        }
        for c in (1, 8, 64)
    ]


def spec(**vllm: object) -> dict:
    return {
        "model": {"id": "meta-llama/Llama-3.1-8B", "dtype": "bfloat16"},
        "workload": {"input_len": 1024, "output_len": 128, "prefix_len": 0},
        "backends": [{"kind": "hf-sequential"}, {"kind": "vllm", **vllm}],
    }


def env(gpu: str = "NVIDIA H100 80GB HBM3", count: int = 1) -> dict:
    return {
        "gpu": {"model": gpu, "count": count, "memory_total_mib": 81559},
        "model": {"config": LLAMA_8B},
        "env": {},
    }


def test_the_plan_estimates_the_cache_and_says_so() -> None:
    plan = cap.plan(spec(), env(), curve())
    assert plan.kv_bytes_per_token == 131_072
    assert plan.kv_bytes_per_request == 131_072 * (1024 + 128)
    assert plan.weights_bytes == pytest.approx(16.06e9, rel=0.01)
    expected = 81559 * 2**20 * 0.9 - plan.weights_bytes
    assert plan.cache.bytes == pytest.approx(expected, rel=1e-6)
    assert plan.cache.estimated and plan.cache.source.startswith("estimate:")
    assert plan.cache_limited_concurrency == int(expected) // (131_072 * 1152)  # ~374
    assert 300 < plan.cache_limited_concurrency < 450


def test_vllms_own_cache_size_wins_over_the_estimate() -> None:
    reported = [{"num_gpu_blocks": 20_000, "block_size": 16}]
    plan = cap.plan(spec(kv_cache_dtype="fp8"), env(), curve(), reported=reported)
    assert plan.kv_bytes_per_token == 65_536  # fp8 cache: one byte per element
    assert not plan.cache.estimated and "reported by vLLM" in plan.cache.source
    assert plan.cache.bytes == 20_000 * 16 * 65_536
    assert plan.cache_limited_concurrency == 320_000 // 1152


def test_the_decode_roofline_fraction() -> None:
    plan = cap.plan(spec(), env(), curve(tpot_ms=10.0))
    first = plan.roofline[0]
    # One sequence: weights + its KV (1024 + 64 tokens) read every 10 ms.
    step = plan.weights_bytes + 1 * (1024 + 64) * 131_072
    assert first.bytes_per_step == pytest.approx(step)
    assert first.fraction == pytest.approx(step / 0.010 / 3350e9)
    assert plan.best_roofline.x == 64  # a bigger batch reads more KV per step


def test_the_roofline_uses_the_batch_the_server_measured_not_the_clients_concurrency():
    """At concurrency 64 the server ran 41.5 requests on average (the client's ramp, the
    tail): that is the batch each decode step read, and the point says it was measured."""
    points = curve(tpot_ms=10.0)
    points[2]["running_batch"] = 41.5
    plan = cap.plan(spec(), env(), points)
    assumed, measured = plan.roofline[1], plan.roofline[2]
    assert (assumed.batch, assumed.batch_source) == (8, "assumed")
    assert (measured.batch, measured.batch_source) == (41.5, "measured")
    step = plan.weights_bytes + 41.5 * (1024 + 64) * 131_072
    assert measured.bytes_per_step == pytest.approx(step)
    assert measured.fraction == pytest.approx(step / 0.010 / 3350e9)


@pytest.mark.parametrize(
    ("environment", "note"),
    [
        ({"gpu": {"model": "none", "count": 0}, "model": {"config": LLAMA_8B}}, "n/a on CPU"),
        (env(gpu="NVIDIA Mystery 9000"), "n/a: unknown GPU"),
    ],
)
def test_no_roofline_on_cpu_or_an_unknown_gpu(environment: dict, note: str) -> None:
    plan = cap.plan(spec(), environment, curve())
    assert plan.roofline == [] and plan.roofline_note.startswith(note)
    assert plan.kv_bytes_per_token == 131_072  # the arithmetic still holds


def test_without_a_model_config_the_plan_says_why() -> None:
    plan = cap.plan(spec(), {"gpu": {"model": "NVIDIA L4", "count": 1}}, curve())
    assert plan.kv_bytes_per_token is None and "config" in plan.notes[0]
