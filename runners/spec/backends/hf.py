"""The Hugging Face Transformers baselines, run in the runner's own process: the sequential
loop (``HFBackend``), its static-cache compiled variant (``HFStaticCacheBackend``) and
static batches (``HFBatchedBackend``); and the rules they put on the rest of the spec (they
send the servers' prompts, greedily, within max_model_len; hf-batched cannot follow a
request rate)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from runners.spec.backends.base import NamedBackend
from runners.spec.common import FieldError

if TYPE_CHECKING:
    from runners.spec.root import Spec


class HFBackend(NamedBackend):
    """The naive baseline: one request at a time through transformers' generate()."""

    kind: Literal["hf-sequential"] = "hf-sequential"
    name: str = "hf-sequential"
    num_prompts: int = Field(
        16, ge=1, le=10_000, description="Requests to time (sequential, so keep it modest)."
    )
    input_len: int | None = Field(None, ge=1, description="Defaults to the workload's.")
    output_len: int | None = Field(None, ge=1, description="Defaults to the workload's.")
    num_warmups: int = Field(1, ge=0, le=100)
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None


class HFStaticCacheBackend(HFBackend):
    """The sequential baseline with generate()'s static KV cache and a torch.compile'd
    forward (``runners.hf_baselines``); compile time is recorded apart."""

    kind: Literal["hf-static-cache"] = "hf-static-cache"  # type: ignore[assignment]
    name: str = "hf-static-cache"
    compile_backend: Literal["inductor", "aot_eager"] = Field(
        "inductor", description="torch.compile backend (aot_eager: no code generation)."
    )


class HFBatchedBackend(NamedBackend):
    """An optimized batch-generation script: at each sweep point, the point's prompts
    through generate() in static padded batches of the point's concurrency
    (``runners.hf_baselines``)."""

    kind: Literal["hf-batched"] = "hf-batched"
    name: str = "hf-batched"
    num_warmups: int = Field(1, ge=0, le=100)
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None


def check_baseline_prompts(spec: Spec) -> None:
    """The HF baseline must send the prompts the servers get: random ones of input_len
    tokens, or the custom file's (in file order, with the chat template when the servers
    are asked through chat), greedily. ShareGPT and prefix-repetition prompts it cannot
    reproduce, sampling it does not do."""
    w = spec.workload
    hf = [i for i, b in enumerate(spec.backends) if isinstance(b, HFBackend | HFBatchedBackend)]
    if hf and w.dataset in ("sharegpt", "prefix_repetition"):
        raise FieldError(
            f"backends.{hf[0]}.kind",
            f"the HF baseline cannot send the {w.dataset} prompts of the other backends "
            "(it sends random prompts of input_len tokens, or a custom JSONL file's), so "
            "the two would not compare; remove the hf-sequential backend or use dataset "
            "'random' or 'custom'",
        )
    if hf and not w.greedy:
        field = "temperature" if w.temperature != 0 else "top_p" if w.top_p else "top_k"
        raise FieldError(
            f"workload.{field}",
            "the HF baseline decodes greedily, so sampled requests to the other backends "
            "would not compare with it; remove the hf-sequential backend or sample "
            "greedily (temperature 0, no top_p or top_k)",
        )
    if hf and w.dataset == "custom" and len({b.api for b in spec.served_backends}) > 1:
        first = next(i for i, b in enumerate(spec.backends) if getattr(b, "api", None) == "chat")
        raise FieldError(
            f"backends.{first}.api",
            "with a custom prompt file the HF baseline sends the prompts as the servers "
            "get them (the chat template applied when they are asked through chat), so "
            "every vllm and endpoint backend must use the same api",
        )


def check_batched_load(spec: Spec) -> None:
    """hf-batched runs static batches of a point's concurrency back to back: it cannot
    follow a request rate. At a point whose requests arrive at a rate (a request_rate
    sweep or search, a rate or ramp-up for every point), its batch would be the
    client's concurrency cap (all the prompts at once, under a rate), and its numbers
    beside the rate-limited servers' would read as the same load when they are not.

    A refusal added after runs were stored: ``Spec`` does not apply it to a stored spec."""
    batched = [i for i, b in enumerate(spec.backends) if isinstance(b, HFBatchedBackend)]
    if not batched:
        return
    w = spec.workload
    where = None
    if w.request_rate is not None:
        where = "workload.request_rate"
    elif w.ramp_up is not None:
        where = "workload.ramp_up"
    for i, sweep in enumerate(spec.sweeps):
        if where is None and sweep.axis == "request_rate":
            where = f"sweeps.{i}.axis"
        elif where is None and sweep.fixed.request_rate is not None:
            where = f"sweeps.{i}.fixed.request_rate"
    if where is None:
        return
    raise FieldError(
        where,
        f"hf-batched (backends.{batched[0]}) runs static batches back to back and cannot "
        "send requests at a rate, so its numbers at these points would not be measured "
        "under the load the servers get; remove the hf-batched backend, or measure it in "
        "a spec whose sweeps send every request at once (a max_concurrency, input_len or "
        "output_len sweep without a request rate)",
    )


def check_baseline_lengths(spec: Spec) -> None:
    """A sequential baseline's own lengths fit in max_model_len (with generated prompts)."""
    generated = spec.workload.dataset in ("random", "prefix_repetition")
    for i, b in enumerate(spec.backends):
        if not isinstance(b, HFBackend) or not generated:
            continue  # a prompt file's prompts have the lengths they have
        total = (b.input_len or spec.workload.input_len) + (
            b.output_len or spec.workload.output_len
        )
        if total > spec.model.max_model_len:
            raise FieldError(
                f"backends.{i}.input_len",
                f"backend {b.name!r}: input_len + output_len = {total} exceeds "
                f"model.max_model_len {spec.model.max_model_len}",
            )
