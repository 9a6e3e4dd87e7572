"""The concrete workloads a spec measures: ``Point`` (one resolved workload), the sweep
points in execution order, the SLA search's and the HF baseline's points, and the rule
that every point fits in the model's context."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from runners.spec.common import FieldError

if TYPE_CHECKING:
    from runners.spec.backends.hf import HFBackend
    from runners.spec.root import Spec


class Point(BaseModel):
    """One resolved workload: a sweep value with every other field fixed."""

    model_config = ConfigDict(frozen=True)

    sweep: str
    axis: str | None
    value: float | None
    input_len: int
    output_len: int
    max_concurrency: int
    num_prompts: int
    request_rate: float | None

    @property
    def label(self) -> str:
        if self.axis is None:
            return self.sweep
        value = int(self.value) if self.value == int(self.value or 0) else self.value
        return f"{self.axis}={value}"

    @property
    def key(self) -> str:
        """Stable identity of the point inside a run: '<sweep>:<axis>=<value>'."""
        return f"{self.sweep}:{self.label}" if self.axis else self.sweep


def _iter_points(spec: Spec) -> Iterator[Point]:
    w = spec.workload
    base = {
        "input_len": w.input_len,
        "output_len": w.output_len,
        "max_concurrency": w.max_concurrency,
        "num_prompts": w.num_prompts,
        "request_rate": w.request_rate,
    }
    if not spec.sweeps:
        yield Point(sweep="single", axis=None, value=None, **base)
        return
    for sweep in spec.sweeps:
        fixed = {k: v for k, v in sweep.fixed.model_dump().items() if v is not None}
        for value in sweep.values:
            fields = {**base, **fixed, sweep.axis: value}
            yield Point(sweep=sweep.name, axis=sweep.axis, value=value, **fields)


def search_point(spec: Spec, value: float) -> Point:
    """The SLA search's point at ``value`` of its axis (the workload, the search's fixed
    fields, the axis at ``value``)."""
    search = spec.sla_search
    if search is None:
        raise ValueError("the spec has no sla_search")
    w = spec.workload
    fields: dict[str, Any] = {
        "input_len": w.input_len,
        "output_len": w.output_len,
        "max_concurrency": w.max_concurrency,
        "num_prompts": w.num_prompts,
        "request_rate": w.request_rate,
    }
    fields |= {k: v for k, v in search.fixed.model_dump().items() if v is not None}
    fields[search.axis] = int(value) if search.axis == "max_concurrency" else value
    if search.axis == "max_concurrency" and search.fixed.request_rate is None:
        fields["request_rate"] = None  # the concurrency sets the load: all at once
    return Point(sweep=search.name, axis=search.axis, value=value, **fields)


def hf_point(spec: Spec, backend: HFBackend) -> Point:
    """The single point the HF sequential baseline measures."""
    return Point(
        sweep="baseline",
        axis=None,
        value=None,
        input_len=backend.input_len or spec.workload.input_len,
        output_len=backend.output_len or spec.workload.output_len,
        max_concurrency=1,
        num_prompts=backend.num_prompts,
        request_rate=None,
    )


def check_point_lengths(spec: Spec) -> None:
    """Every point (and the search's lowest) has a prompt for each prefix and, with generated
    prompts, fits prefix, prompt and output in model.max_model_len."""
    sweep_index = {s.name: i for i, s in enumerate(spec.sweeps)}
    search = spec.sla_search
    checked = spec.points() + ([search_point(spec, search.low)] if search else [])
    # A trace's lengths come from its file (clipped to the context when replayed).
    generated = spec.workload.dataset in ("random", "prefix_repetition")
    generated = generated and spec.workload.trace is None
    for point in checked:
        total = point.input_len + point.output_len + spec.workload.prefix_len
        if point.num_prompts < spec.workload.num_prefixes and (
            spec.workload.dataset == "prefix_repetition"
        ):
            raise FieldError(
                "workload.num_prefixes",
                f"point {point.key}: num_prompts {point.num_prompts} is below num_prefixes "
                f"{spec.workload.num_prefixes}; every prefix needs a prompt",
            )
        if generated and total > spec.model.max_model_len:
            where = (
                f"sweeps.{sweep_index[point.sweep]}.values"
                if point.sweep in sweep_index
                else "sla_search.fixed.input_len"
                if search and point.sweep == search.name
                else "workload.input_len"
            )
            raise FieldError(
                where,
                f"point {point.key}: prefix_len + input_len + output_len = {total} "
                f"exceeds model.max_model_len {spec.model.max_model_len}",
            )
