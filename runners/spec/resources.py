"""Where a run executes (``Resources``): GPUs, node selector, image, requests, deadline, the
GPU-hour price, and the cluster placement a portal's admin may let a spec choose (Kueue
queue, PriorityClass, GPU resource name).

Also the two formats those Kubernetes-facing values share with the portal's settings, so
a spec and an admin are held to one rule: ``placement_name_problem`` (queue, PriorityClass,
RuntimeClass and extended-resource names) and ``quantity_bytes`` (``64Gi``, ``500M``).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from runners.spec.common import Strict, _safe

# A DNS-1123 label ("kueue" LocalQueue names are also label values: 63 characters at most).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
# A DNS-1123 subdomain: what PriorityClass and RuntimeClass names are (253 at most).
_DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*\Z")
_QUEUE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?\Z")
# An extended resource: 'domain/name' outside kubernetes.io (nvidia.com/gpu, amd.com/gpu,
# nvidia.com/mig-1g.10gb).
_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")

PlacementKind = Literal["queue", "priority_class", "runtime_class", "gpu_resource"]

_WHAT = {
    "queue": (
        "a Kueue LocalQueue name: 1-63 lowercase letters, digits, '-' or '.', starting and "
        "ending with a letter or digit (e.g. 'team-a')"
    ),
    "priority_class": (
        "a PriorityClass name: lowercase letters, digits, '-' and '.' (a DNS subdomain, at "
        "most 253 characters, e.g. 'benchmark-low')"
    ),
    "runtime_class": (
        "a RuntimeClass name: lowercase letters, digits, '-' and '.' (a DNS subdomain, at "
        "most 253 characters, e.g. 'nvidia')"
    ),
    "gpu_resource": (
        "an extended resource name 'domain/name' outside kubernetes.io (e.g. "
        "'nvidia.com/gpu', 'nvidia.com/mig-1g.10gb', 'amd.com/gpu')"
    ),
}


def placement_name_problem(kind: PlacementKind, value: str) -> str | None:
    """Why ``value`` cannot be the ``kind`` of name Kubernetes (or Kueue) takes, else None."""
    ok = False
    if kind == "queue":
        ok = bool(_QUEUE.match(value))
    elif kind in ("priority_class", "runtime_class"):
        ok = len(value) <= 253 and bool(_DNS_SUBDOMAIN.match(value))
    elif kind == "gpu_resource":
        domain, slash, name = value.partition("/")
        ok = (
            bool(slash)
            and len(domain) <= 253
            and bool(_DNS_SUBDOMAIN.match(domain))
            and domain != "kubernetes.io"
            and not domain.endswith(".kubernetes.io")
            and not domain.startswith("requests.")
            and bool(_RESOURCE_NAME.match(name))
        )
    return None if ok else f"{value!r} is not {_WHAT[kind]}"


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?\Z")
_FACTORS = {
    None: 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def quantity_bytes(value: str) -> int:
    """A Kubernetes memory quantity ('64Gi', '500M', '1073741824') in bytes; ValueError
    naming the value otherwise (milli and exponent forms are not sizes anyone writes)."""
    found = _QUANTITY.match(value.strip())
    if not found:
        raise ValueError(
            f"{value!r} is not a size: a number with an optional suffix Ki, Mi, Gi, Ti (or "
            "k, M, G, T), e.g. '16Gi'"
        )
    number, suffix = found.groups()
    whole, _, frac = number.partition(".")
    factor = _FACTORS[suffix]
    return int(whole) * factor + (int(frac) * factor // 10 ** len(frac) if frac else 0)


def format_bytes(size: int) -> str:
    """``size`` bytes as the shortest exact binary quantity ('24Gi', '1536Mi', '1000')."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if size and size % _FACTORS[suffix] == 0:
            return f"{size // _FACTORS[suffix]}{suffix}"
    return str(size)


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
    queue: str | None = Field(
        None,
        description=(
            "The Kueue LocalQueue the run's Job waits in (label kueue.x-k8s.io/queue-name); "
            "a portal accepts the queues its admin allows, and uses its own when null."
        ),
    )
    priority_class: str | None = Field(
        None,
        description=(
            "The PriorityClass of the run's Pod; a portal accepts the classes its admin "
            "allows, and uses its own when null."
        ),
    )
    gpu_resource: str | None = Field(
        None,
        description=(
            "The extended resource gpu_count asks for: 'nvidia.com/gpu', a MIG slice such "
            "as 'nvidia.com/mig-1g.10gb' (the device plugin's mixed strategy), "
            "'amd.com/gpu'; a portal accepts the names its admin allows, and uses its own "
            "when null."
        ),
    )

    @field_validator("gpu_type", "image", "cpu", "memory")
    @classmethod
    def _s(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "value")

    @field_validator("queue", "priority_class", "gpu_resource")
    @classmethod
    def _placement(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        problem = placement_name_problem(info.field_name, v)  # type: ignore[arg-type]
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("node_selector")
    @classmethod
    def _ns(cls, v: dict[str, str]) -> dict[str, str]:
        for key, val in v.items():
            _safe(key, "node selector key")
            _safe(val, "node selector value")
        return v
