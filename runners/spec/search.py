"""Service-level objectives: ``SLO`` (goodput) and ``SLASearch`` (the highest load that meets
latency limits), ``slo_text`` to say a limit, and the rules a search puts on the spec."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from runners.choices import choice_message
from runners.spec.common import (
    MAX_BACKENDS,
    MAX_CONCURRENCY,
    MAX_CONFIGS,
    FieldError,
    Strict,
    _label,
)
from runners.spec.workload import WorkloadOverrides

if TYPE_CHECKING:
    from runners.spec.root import Spec


class SLO(Strict):
    """Service-level objectives for goodput: a request counts when it meets all given."""

    ttft_ms: float | None = Field(None, gt=0)
    tpot_ms: float | None = Field(None, gt=0)
    e2el_ms: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one(self) -> SLO:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None:
            raise ValueError("an SLO needs at least one of ttft_ms, tpot_ms, e2el_ms")
        return self


SLO_METRICS = tuple(
    f"{stat}_{metric}_ms"
    for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "p90", "p99")
)
SEARCH_AXES = ("request_rate", "max_concurrency")


class SLASearch(Strict):
    """Find the highest request rate or concurrency at which a backend meets an SLO.

    Adaptive (``runners.sla``): the low end, then the high end, then bisection between the
    highest value that met the SLO and the lowest that did not, until they are within
    ``tolerance`` (concurrency: adjacent) or ``max_points`` points were measured. Each
    point is an ordinary measurement under the key ``<name>:<axis>=<value>``, with the
    workload (and ``fixed``) at that load. Runs once per backend (repeat 0); a load that
    missed the SLO is measured once more (repeat 1) where ``confirm`` says so.
    """

    name: str = Field("sla", description="The sweep name of the search's points.")
    axis: Literal["request_rate", "max_concurrency"]
    slo: dict[str, float] = Field(
        description="Latency limits in ms every search point must meet, keyed like the "
        "metrics: {mean,median,p90,p99}_{ttft,tpot,itl,e2el}_ms, e.g. {p99_ttft_ms: 500}.",
        min_length=1,
        max_length=8,
    )
    low: float = Field(gt=0, description="The lowest load tried (measured first).")
    high: float = Field(gt=0, description="The highest load tried (measured second).")
    max_points: int = Field(8, ge=2, le=32, description="The most points the search measures.")
    tolerance: float = Field(
        0.1,
        gt=0,
        le=1,
        description="Stop when the highest passing and the lowest failing load differ by "
        "at most this fraction (concurrency: when they are adjacent).",
    )
    confirm: Literal["none", "low", "failures"] = Field(
        "low",
        description="Which missed loads are measured once more before the search believes "
        "them (a stall of the machine or the network only ever adds latency, so a miss can "
        "be noise where a pass cannot): 'low' the low end, whose miss ends the search with "
        "no answer; 'failures' every miss (an answer that a one-off stall cannot lower, at "
        "up to twice the points); 'none' nothing. A load misses when its last measurement "
        "misses. Each measurement counts against max_points.",
    )
    backends: list[str] = Field(
        default_factory=list,
        max_length=MAX_BACKENDS + MAX_CONFIGS,  # a configuration search's, by name
        description="Backend names to search on; empty: every vllm and endpoint backend.",
    )
    fixed: WorkloadOverrides = Field(
        default_factory=WorkloadOverrides,
        description="Workload fields held at a value of the search's own.",
    )

    @model_validator(mode="before")
    @classmethod
    def _measured_before_confirm(cls, data: Any, info: ValidationInfo) -> Any:
        # A run stored before ``confirm`` existed measured every load once: read it so,
        # or its finished search would seem to wait for a confirmation.
        if (info.context or {}).get("stored") and isinstance(data, dict):
            return {"confirm": "none", **data}
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _label(v, "the search's name")

    @field_validator("slo")
    @classmethod
    def _slo(cls, v: dict[str, float]) -> dict[str, float]:
        for key, limit in v.items():
            if key not in SLO_METRICS:
                raise FieldError(key, choice_message(key, SLO_METRICS, "latency metric"))
            if not (isinstance(limit, int | float) and math.isfinite(limit) and limit > 0):
                raise FieldError(key, "an SLO limit is a positive number of milliseconds")
        return {k: float(x) for k, x in v.items()}

    @model_validator(mode="after")
    def _range(self) -> SLASearch:
        if self.low >= self.high:
            raise FieldError("high", "high must be above low")
        if self.axis == "max_concurrency":
            for field in ("low", "high"):
                value = getattr(self, field)
                if value != int(value):
                    raise FieldError(field, "a concurrency is a whole number")
            if self.high > MAX_CONCURRENCY:
                raise FieldError("high", f"concurrency is at most {MAX_CONCURRENCY}")
        if getattr(self.fixed, self.axis) is not None:
            raise FieldError(
                f"fixed.{self.axis}", f"'fixed' must not pin the searched axis {self.axis}"
            )
        return self

    def describe_slo(self) -> str:
        """'p99 TTFT <= 500 ms, p99 TPOT <= 50 ms'."""
        return ", ".join(slo_text(k, v) for k, v in self.slo.items())


def slo_text(key: str, limit: float) -> str:
    """'p99_ttft_ms', 500 -> 'p99 TTFT <= 500 ms'."""
    stat, metric, _ = key.split("_")
    return f"{stat} {metric.upper()} <= {limit:g} ms"


def check_search(spec: Spec) -> None:
    """An SLA search has a name of its own and searches served backends of this spec at a
    load its axis sets (no ramp-up). On request_rate the client's concurrency is unlimited
    unless its ``fixed`` caps it (written into the spec as executed)."""
    search = spec.sla_search
    if search is None:
        return
    if search.name == "baseline" or search.name in {s.name for s in spec.sweeps}:
        raise FieldError(
            "sla_search.name",
            f"{search.name!r} is taken by a sweep (or the HF baseline); name the search otherwise",
        )
    served = {b.name for b in spec.served_backends}
    if not served:
        raise FieldError(
            "sla_search", "an SLA search needs a vllm or endpoint backend to search on"
        )
    for i, name in enumerate(search.backends):
        if name not in served:
            raise FieldError(
                f"sla_search.backends.{i}",
                f"{name!r} is not a vllm or endpoint backend of this spec "
                f"({', '.join(sorted(served))})",
            )
    if search.axis == "request_rate" and spec.workload.ramp_up is not None:
        raise FieldError(
            "sla_search.axis",
            "a request_rate search sets the rate of each point; remove workload.ramp_up",
        )
    if search.axis == "request_rate" and search.fixed.max_concurrency is None:
        # As under a request_rate sweep: the arrivals set the load, not a cap.
        prompts = search.fixed.num_prompts or spec.workload.num_prompts
        search.fixed = search.fixed.model_copy(update={"max_concurrency": prompts})
    if search.axis == "max_concurrency" and spec.workload.ramp_up is not None:
        raise FieldError(
            "sla_search.axis",
            "a max_concurrency search sends every request at once; remove "
            "workload.ramp_up, or search on request_rate",
        )
