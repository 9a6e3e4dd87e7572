"""Transformers' own OpenAI-compatible server (``TransformersServeBackend``), started by the
runner, and what it cannot be given (another tokenizer, an '@' in the model id)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from runners.spec.backends.base import Api, NamedBackend
from runners.spec.common import FieldError

if TYPE_CHECKING:
    from runners.spec.root import Spec


class TransformersServeBackend(NamedBackend):
    """Transformers' own OpenAI-compatible server (``transformers serve``), started and
    stopped by the runner like a vLLM server and measured at the same points with the same
    client and metric definitions (``runners.transformers_server``). Output lengths are
    forced as vLLM's ``ignore_eos`` forces them, through the server's ``generation_config``
    request field, and checked per request."""

    kind: Literal["transformers-serve"] = "transformers-serve"
    name: str = "transformers-serve"
    api: Api = Field("completions", description="'completions' or 'chat'.")
    continuous_batching: bool = Field(
        True,
        description="--continuous-batching (paged attention, requests batched as they "
        "come) or, when false, one generate() call at a time.",
    )
    compile: bool = Field(False, description="--compile: static cache and torch.compile.")
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "sdpa_paged"] | None = Field(
        None, description="--attn-implementation (the server's default when left out)."
    )
    cb_num_blocks: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="--cb-num-blocks: KV-cache blocks for continuous batching (the server "
        "sizes the cache from free memory when left out; on CPU, set it).",
    )
    cb_block_size: int | None = Field(None, ge=1, le=1024, description="--cb-block-size.")
    cb_max_batch_tokens: int | None = Field(
        None, ge=1, le=10_000_000, description="--cb-max-batch-tokens."
    )
    startup_timeout_s: int = Field(600, ge=10, le=7200)

    @model_validator(mode="after")
    def _batching(self) -> TransformersServeBackend:
        if not self.continuous_batching:
            for key in ("cb_num_blocks", "cb_block_size", "cb_max_batch_tokens"):
                if getattr(self, key) is not None:
                    raise FieldError(key, f"{key} needs continuous_batching: true")
        return self

    @property
    def request_fields(self) -> str:
        """How the bench client asks it: OpenAI fields plus its ``generation_config``."""
        return "transformers"

    @property
    def lora_names(self) -> list[str]:
        return []

    def server_config(self) -> dict[str, Any]:
        """What the fingerprint compares: the server's options and the API asked."""
        return self.model_dump(mode="json", exclude={"name", "kind", "startup_timeout_s"})


def check_transformers_serve(spec: Spec) -> None:
    """What ``transformers serve`` cannot be given: it loads the model's own tokenizer
    and names a model ``id@revision``."""
    i = next(
        (i for i, b in enumerate(spec.backends) if isinstance(b, TransformersServeBackend)),
        None,
    )
    if i is None:
        return
    name = spec.backends[i].name
    if spec.model.tokenizer:
        raise FieldError(
            "model.tokenizer",
            f"backend {name!r} (transformers serve) loads the model's own tokenizer and "
            "has no option for another; leave model.tokenizer out or remove the backend",
        )
    if "@" in spec.model.id:
        raise FieldError(
            "model.id",
            f"backend {name!r} (transformers serve) reads '@' in a model id as the "
            "start of a revision; put the revision in model.revision",
        )
