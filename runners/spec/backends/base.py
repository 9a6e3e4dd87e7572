"""What the backend kinds share: ``NamedBackend`` (a name, unique in the spec) and the
request APIs of the served kinds (``Api``, ``API_ENDPOINTS``, ``LoRAAssignment``)."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from runners.spec.common import Strict, _label


class NamedBackend(Strict):
    """What every backend kind has: a name, unique in the spec, shown on every page."""

    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _label(v, "backend name")


Api = Literal["completions", "chat"]
LoRAAssignment = Literal["random", "round-robin"]
API_ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
