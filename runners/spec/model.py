"""The model under test (``ModelSpec``): its id or directory, revision, tokenizer, dtype
and context length."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from runners.spec.common import _SAFE_PATH, Strict, _safe


class ModelSpec(Strict):
    """The model under test: a Hugging Face hub id or a local directory."""

    id: str = Field(
        description="Hugging Face repo id (org/name) or a local directory with the weights.",
        examples=["Qwen/Qwen3-0.6B"],
    )
    revision: str | None = Field(
        None, description="Hub branch, tag or commit. Resolved to a commit hash at run time."
    )
    tokenizer: str | None = Field(None, description="Tokenizer id or path, if not the model's.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="Weight and activation dtype for both backends."
    )
    max_model_len: int = Field(
        4096, ge=64, le=1_048_576, description="Context length the server is started with."
    )
    trust_remote_code: bool = False

    @field_validator("id", "tokenizer")
    @classmethod
    def _path_or_id(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "model id", _SAFE_PATH)

    @field_validator("revision")
    @classmethod
    def _rev(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "revision")
