"""Where a run executes (``Resources``): GPUs, node selector, image, requests, deadline and
the GPU-hour price."""

from __future__ import annotations

from pydantic import Field, field_validator

from runners.spec.common import Strict, _safe


class Resources(Strict):
    """Where the run executes (used by the Kubernetes executor; ignored locally)."""

    gpu_count: int = Field(1, ge=0, le=64)
    gpu_type: str | None = Field(
        None,
        description=(
            "The node label value of the GPU type (GPU feature discovery's "
            "nvidia.com/gpu.product, e.g. 'NVIDIA-H100-80GB-HBM3'); a portal accepts the "
            "types its admin listed."
        ),
    )
    node_selector: dict[str, str] = Field(default_factory=dict, max_length=16)
    image: str | None = Field(None, description="Runner image; the deployment's default if null.")
    cpu: str | None = Field(None, description="CPU request, Kubernetes quantity ('8').")
    memory: str | None = Field(None, description="Memory request, Kubernetes quantity ('64Gi').")
    timeout_minutes: int = Field(180, ge=1, le=7 * 24 * 60, description="Deadline for the run.")
    gpu_hour_price: float | None = Field(
        None,
        ge=0,
        le=10_000,
        description=(
            "Price of one GPU for one hour, for the cost per million output tokens; the "
            "portal's default for the GPU type when null (SERVEBENCH_GPU_HOUR_PRICES)."
        ),
    )

    @field_validator("gpu_type", "image", "cpu", "memory")
    @classmethod
    def _s(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "value")

    @field_validator("node_selector")
    @classmethod
    def _ns(cls, v: dict[str, str]) -> dict[str, str]:
        for key, val in v.items():
            _safe(key, "node selector key")
            _safe(val, "node selector value")
        return v
