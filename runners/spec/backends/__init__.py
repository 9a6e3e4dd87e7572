"""The backend kinds a spec may list, one module each with its own rules: ``hf`` (the
in-process Transformers baselines), ``vllm`` (a vLLM server and its flag allow-list),
``endpoint`` (a deployed server), ``transformers_serve``; ``base`` holds what they share.
``Backend`` is the union a spec's ``backends`` list holds, told apart by ``kind``."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from runners.spec.backends.endpoint import EndpointBackend
from runners.spec.backends.hf import HFBackend, HFBatchedBackend, HFStaticCacheBackend
from runners.spec.backends.transformers_serve import TransformersServeBackend
from runners.spec.backends.vllm import VLLMBackend

Backend = Annotated[
    HFBackend
    | HFStaticCacheBackend
    | HFBatchedBackend
    | VLLMBackend
    | EndpointBackend
    | TransformersServeBackend,
    Field(discriminator="kind"),
]
ServedBackend = VLLMBackend | EndpointBackend | TransformersServeBackend

# The kinds' tags, in the union's order (pydantic puts a tag in an error's location;
# ``errors_from`` leaves it out, so a field reads 'backends.0.name').
BACKEND_KINDS = (
    "hf-sequential",
    "hf-static-cache",
    "hf-batched",
    "vllm",
    "endpoint",
    "transformers-serve",
)
