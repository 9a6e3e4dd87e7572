"""The requests sent to the servers and how sweeps vary them: ``Workload`` (with its
``RampUp``), ``Sweep`` (one axis over listed values) and ``WorkloadOverrides`` (what a sweep
or a search pins). Also the spec-wide workload rules ``Spec`` applies: a prompt file makes
input_len meaningless, and under a request rate the client's concurrency is unlimited.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from runners.spec.common import (
    _SAFE_PATH,
    MAX_CLIENTS,
    MAX_CONCURRENCY,
    MAX_SWEEP_VALUES,
    FieldError,
    Strict,
    _label,
    _safe,
    _without_defaults,
)
from runners.spec.traffic import Sessions, Trace

if TYPE_CHECKING:
    from runners.spec.root import Spec


class RampUp(Strict):
    """The request rate rising from ``start_rps`` to ``end_rps`` over the point
    (vLLM's bench client: ``--ramp-up-strategy``)."""

    strategy: Literal["linear", "exponential"] = "linear"
    start_rps: int = Field(ge=0, le=100_000, description="Requests/s at the start.")
    end_rps: int = Field(ge=1, le=100_000, description="Requests/s at the end.")

    @model_validator(mode="after")
    def _order(self) -> RampUp:
        if self.start_rps > self.end_rps:
            raise FieldError("start_rps", "start_rps must not be above end_rps")
        if self.strategy == "exponential" and self.start_rps == 0:
            raise FieldError("start_rps", "an exponential ramp-up cannot start at 0 requests/s")
        return self


# Workload fields added after runs were stored, at their defaults (see _without_defaults).
_ADDED_WORKLOAD_DEFAULTS: dict[str, Any] = {
    "num_prefixes": 10,
    "temperature": 0.0,
    "top_p": None,
    "top_k": None,
    "ramp_up": None,
    "trace": None,
    "sessions": None,
    "clients": 1,
}


class Workload(Strict):
    """The requests sent to the server. Sweeps vary one of these fields at a time."""

    dataset: Literal["random", "sharegpt", "prefix_repetition", "custom"] = Field(
        "random",
        description=(
            "'random' token prompts; 'sharegpt' (a ShareGPT-style JSON file); "
            "'prefix_repetition' (random prompts sharing one of num_prefixes prefixes of "
            "prefix_len tokens, then input_len tokens of their own: what prefix caching "
            "serves); 'custom' (a JSONL file of {\"prompt\": ...} lines, sent in file order)."
        ),
    )
    dataset_path: str | None = Field(
        None, description="The prompts file: ShareGPT JSON (sharegpt) or JSONL (custom)."
    )
    input_len: int = Field(1024, ge=1, le=1_048_576, description="Prompt tokens per request.")
    output_len: int = Field(128, ge=1, le=1_048_576, description="Generated tokens per request.")
    range_ratio: float = Field(
        0.0, ge=0.0, lt=1.0, description="Lengths drawn uniformly in [len*(1-r), len*(1+r)]."
    )
    prefix_len: int = Field(0, ge=0, le=1_048_576, description="Shared prefix tokens per prompt.")
    num_prompts: int = Field(256, ge=1, le=100_000, description="Requests per sweep point.")
    max_concurrency: int = Field(
        1,
        ge=1,
        le=MAX_CONCURRENCY,
        description=(
            "Requests in flight at once (the client's limit). When request_rate drives the "
            "load (a request_rate sweep, or request_rate set) and this is not given, there "
            "is no limit: it is set to num_prompts."
        ),
    )
    request_rate: float | None = Field(
        None, gt=0, description="Poisson arrival rate in requests/s; null sends all at once."
    )
    burstiness: float = Field(1.0, gt=0, description="Gamma shape of arrivals (1 = Poisson).")
    ignore_eos: bool = Field(True, description="Generate exactly output_len tokens per request.")
    num_warmups: int = Field(8, ge=0, le=10_000, description="Warm-up requests before timing.")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    num_prefixes: int = Field(
        10,
        ge=1,
        le=10_000,
        description="Distinct shared prefixes (dataset prefix_repetition); prompts per "
        "prefix = num_prompts // num_prefixes.",
    )
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature (0: greedy).")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling (top_p).")
    top_k: int | None = Field(
        None, ge=1, le=100_000, description="Top-k sampling (not an OpenAI field)."
    )
    ramp_up: RampUp | None = Field(
        None,
        description="Raise the request rate over each point instead of a fixed rate "
        "(exclusive with request_rate).",
    )
    trace: Trace | None = Field(
        None, description="Replay a trace file at its own arrival times (docs/traffic.md)."
    )
    sessions: Sessions | None = Field(
        None, description="Multi-turn conversations instead of single requests."
    )
    clients: Annotated[int, Field(ge=1, le=MAX_CLIENTS)] | Literal["auto"] = Field(
        1,
        description=(
            "Load generators per point: that many bench client processes, each sending "
            "its share of the prompts, the concurrency and the request rate to the same "
            "server, started together; their per-request samples are merged exactly "
            "(docs/specs.md#many-load-generators). 'auto': a short probe at each served "
            "backend's heaviest point raises the count from 1 while the achieved rate "
            "still grows, and every point uses the count it found."
        ),
    )

    @field_validator("clients", mode="before")
    @classmethod
    def _clients(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().isdigit():
            v = int(v)
        if v == "auto" or (
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_CLIENTS
        ):
            return v
        raise ValueError(
            f"must be a whole number of load generators from 1 to {MAX_CLIENTS}, or 'auto' "
            f"(a short probe chooses), not {v!r}"
        )

    @field_validator("dataset_path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "dataset path", _SAFE_PATH)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_defaults(handler(self), _ADDED_WORKLOAD_DEFAULTS)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 and self.top_p is None and self.top_k is None

    @model_validator(mode="after")
    def _dataset_needs_path(self) -> Workload:
        if self.dataset in ("sharegpt", "custom") and not self.dataset_path:
            raise FieldError(
                "dataset_path", f"dataset_path is required when dataset is {self.dataset!r}"
            )
        if self.dataset in ("random", "prefix_repetition") and self.dataset_path:
            raise FieldError(
                "dataset_path", "dataset_path is only used with dataset 'sharegpt' or 'custom'"
            )
        if self.dataset == "custom" and not str(self.dataset_path).endswith(".jsonl"):
            raise FieldError(
                "dataset_path", "dataset 'custom' reads a JSONL file: its name ends in .jsonl"
            )
        if self.dataset == "prefix_repetition" and self.prefix_len < 1:
            raise FieldError(
                "prefix_len",
                "dataset 'prefix_repetition' needs prefix_len >= 1 (the tokens each group of "
                "prompts shares)",
            )
        if self.ramp_up is not None and self.request_rate is not None:
            raise FieldError(
                "ramp_up", "ramp_up sets the request rate itself: leave request_rate out"
            )
        if self.dataset == "random" and not self.ignore_eos:
            # vLLM's bench client forces ignore-eos for random prompts, and the HF baseline
            # always generates output_len tokens: 'false' would be recorded but not true.
            raise FieldError(
                "ignore_eos",
                "the random dataset always generates exactly output_len tokens; "
                "use dataset 'sharegpt' for natural response lengths",
            )
        return self


SweepAxis = Literal["max_concurrency", "input_len", "output_len", "request_rate", "num_prompts"]
_INT_AXES = {"max_concurrency", "input_len", "output_len", "num_prompts"}


class WorkloadOverrides(Strict):
    """Fields a sweep may pin to a value of its own (the rest come from the workload)."""

    input_len: int | None = Field(None, ge=1, le=1_048_576)
    output_len: int | None = Field(None, ge=1, le=1_048_576)
    max_concurrency: int | None = Field(None, ge=1, le=MAX_CONCURRENCY)
    num_prompts: int | None = Field(None, ge=1, le=100_000)
    request_rate: float | None = Field(None, gt=0)


class Sweep(Strict):
    """One axis varied over listed values, everything else fixed."""

    name: str = Field(description="Short label, unique in the spec (e.g. 'concurrency').")
    axis: SweepAxis
    values: list[float] = Field(min_length=1, max_length=MAX_SWEEP_VALUES)
    fixed: WorkloadOverrides = Field(
        default_factory=WorkloadOverrides,
        description="Workload fields held at a value of this sweep's own.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _label(v, "sweep name")

    @model_validator(mode="after")
    def _values(self) -> Sweep:
        if len(set(self.values)) != len(self.values):
            raise FieldError("values", "sweep values must be unique")
        if any(v <= 0 for v in self.values):
            raise FieldError("values", "sweep values must be positive")
        if self.axis in _INT_AXES:
            if any(v != int(v) for v in self.values):
                raise FieldError("values", f"values of axis {self.axis} must be whole numbers")
            # Keep them ints so JSON, CLI args and point keys read '16', not '16.0'.
            object.__setattr__(self, "values", [int(v) for v in self.values])
        if getattr(self.fixed, self.axis) is not None:
            raise FieldError(
                f"fixed.{self.axis}", f"'fixed' must not pin the swept axis {self.axis}"
            )
        return self


def check_file_prompts(spec: Spec) -> None:
    """A file's prompts (sharegpt, custom) have the lengths they have: no sweep may vary or
    pin input_len."""
    w = spec.workload
    if w.dataset not in ("sharegpt", "custom"):
        return
    for i, sweep in enumerate(spec.sweeps):
        if sweep.axis == "input_len":
            raise FieldError(
                f"sweeps.{i}.axis",
                f"with dataset {w.dataset!r} the prompts come from the file, so an "
                "input_len sweep changes nothing; sweep output_len, max_concurrency or "
                "request_rate, or use dataset 'random'",
            )
        if sweep.fixed.input_len is not None:
            raise FieldError(
                f"sweeps.{i}.fixed.input_len",
                f"with dataset {w.dataset!r} the prompts come from the file; input_len "
                "changes nothing",
            )


def check_clients(spec: Spec) -> None:
    """Several load generators split every point: each needs at least one prompt and, when
    concurrency drives the load, one request in flight; and only vLLM's client (random,
    prefix_repetition or sharegpt prompts, a fixed rate) can be split today."""
    w = spec.workload
    n = w.clients
    if n == 1:
        return
    what = "workload.clients: auto" if n == "auto" else "workload.clients"
    why = None
    if w.trace is not None or w.sessions is not None:
        why = "a trace or sessions are replayed by one traffic client"
    elif w.dataset == "custom":
        why = "every client would send the file's same first prompts"
    elif w.ramp_up is not None:
        why = "a ramp-up's integer start and end rates cannot be split between clients"
    if why:
        raise FieldError(
            "workload.clients", f"{what} cannot be used here (one client only): {why}; remove it"
        )
    if n == "auto":
        return  # the probe stays within each point's prompts and requests in flight
    for point in spec.points():
        if point.num_prompts < n:
            raise FieldError(
                "workload.clients",
                f"workload.clients is {n} but point {point.key} sends only "
                f"{point.num_prompts} prompts: each client needs at least one; lower "
                "clients or raise num_prompts",
            )
        if point.request_rate is None and point.max_concurrency < n:
            raise FieldError(
                "workload.clients",
                f"workload.clients is {n} but point {point.key} keeps only "
                f"{point.max_concurrency} requests in flight: each client needs at least "
                "one; lower clients or raise max_concurrency",
            )


def unlimited_concurrency_under_a_rate(spec: Spec) -> None:
    """Under a request rate the arrivals set the load: unless the spec caps it, the
    client's concurrency is unlimited (num_prompts), written into the spec so the
    spec as executed says so (the default of 1 would silently serialise the rate).
    The same under a ramp-up of the rate."""
    w = spec.workload
    for i, sweep in enumerate(spec.sweeps):
        if sweep.axis == "request_rate" and w.ramp_up is not None:
            raise FieldError(
                f"sweeps.{i}.axis",
                "a request_rate sweep sets the rate of each point; remove workload.ramp_up",
            )
        if sweep.fixed.request_rate is not None and w.ramp_up is not None:
            raise FieldError(
                f"sweeps.{i}.fixed.request_rate",
                "workload.ramp_up sets the request rate itself: leave request_rate out",
            )
    if "max_concurrency" in spec.workload.model_fields_set:
        return
    if (w.request_rate is not None or w.ramp_up is not None) and (
        w.max_concurrency < w.num_prompts
    ):
        spec.workload = w.model_copy(update={"max_concurrency": w.num_prompts})
    for sweep in spec.sweeps:
        if sweep.axis != "request_rate" or sweep.fixed.max_concurrency is not None:
            continue
        prompts = sweep.fixed.num_prompts or spec.workload.num_prompts
        sweep.fixed = sweep.fixed.model_copy(update={"max_concurrency": prompts})
