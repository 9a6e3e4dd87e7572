"""The spec itself (``Spec``): its sections, the rules that span them, and what the runner
and the portal ask of it (backends by kind, points, how many measurements a run reports).

The cross-section rules live with what they concern (the backend kinds' modules, the
workload, the search, the points); ``Spec._consistent`` calls them in a fixed order, since
a spec's first error is the one a user sees.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from runners.spec.backends import Backend, ServedBackend
from runners.spec.backends.endpoint import EndpointBackend, check_endpoints
from runners.spec.backends.hf import (
    HFBackend,
    HFBatchedBackend,
    check_baseline_lengths,
    check_baseline_prompts,
    check_batched_load,
)
from runners.spec.backends.transformers_serve import (
    TransformersServeBackend,
    check_transformers_serve,
)
from runners.spec.backends.vllm import VLLMBackend, check_parallelism
from runners.spec.common import (
    _FREE_TEXT_BAD,
    MAX_BACKENDS,
    MAX_POINTS,
    MAX_REPEATS,
    MAX_SWEEPS,
    SPEC_VERSION,
    FieldError,
    Strict,
    _without_defaults,
)
from runners.spec.configsearch import MAX_CONFIGS, ConfigSearch, expand_configs
from runners.spec.model import ModelSpec
from runners.spec.points import Point, _iter_points, check_point_lengths
from runners.spec.resources import Resources
from runners.spec.search import SLO, SLASearch, check_search
from runners.spec.traffic import Correctness, check_traffic
from runners.spec.workload import (
    Sweep,
    Workload,
    check_clients,
    check_file_prompts,
    unlimited_concurrency_under_a_rate,
)


class Spec(Strict):
    """A complete benchmark spec (version 1)."""

    # Parsed with parse_spec(stored=True): kept on the instance, since an assignment
    # re-validates the spec (validate_assignment) without the parse's context.
    _stored: bool = PrivateAttr(default=False)

    version: Literal[1] = Field(SPEC_VERSION, description="Spec schema version.")
    name: str | None = Field(None, max_length=200, description="Human-readable run name.")
    description: str | None = Field(None, max_length=5000)
    model: ModelSpec
    workload: Workload = Field(default_factory=Workload)
    sweeps: list[Sweep] = Field(default_factory=list, max_length=MAX_SWEEPS)
    backends: list[Backend] = Field(
        default_factory=lambda: [HFBackend(), VLLMBackend()],
        min_length=1,
        # A configuration search's expansion (config_search) adds up to MAX_CONFIGS.
        max_length=MAX_BACKENDS + MAX_CONFIGS - 1,
    )
    repeats: int = Field(1, ge=1, le=MAX_REPEATS)
    slo: SLO | None = None
    sla_search: SLASearch | None = Field(
        None,
        description="Find the highest request rate or concurrency that meets an SLO "
        "(an adaptive search of at most max_points points per backend).",
    )
    config_search: ConfigSearch | None = Field(
        None,
        description="Run one vllm backend as several engine configurations (a grid or a "
        "list), each its own server; with sla_search, ranked by their answers, later ones "
        "dropped early when they miss the SLO at the leader's answer.",
    )
    resources: Resources = Field(default_factory=Resources)
    correctness: Correctness | None = Field(
        None,
        description="Check a sample of each point's answers against a reference and an "
        "eval file, beside the speed (docs/traffic.md).",
    )

    @field_validator("name")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        if v is not None and _FREE_TEXT_BAD.search(v):
            raise ValueError("name must not contain control characters")
        return v

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_defaults(
            handler(self), {"sla_search": None, "correctness": None, "config_search": None}
        )

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Spec:
        """The rules across sections, in the order their errors are reported. Some complete
        the spec as executed (an endpoints-only run asks for no GPU; under a request rate the
        client's concurrency is unlimited)."""
        expand_configs(self)
        self._unique_names()
        check_baseline_prompts(self)
        check_file_prompts(self)
        check_parallelism(self)
        check_endpoints(self)
        check_transformers_serve(self)
        check_search(self)
        check_traffic(self)
        if (info.context or {}).get("stored"):
            self._stored = True
        if not self._stored:
            # Refusals added after runs were accepted: a stored run's spec stays readable.
            check_batched_load(self)
        unlimited_concurrency_under_a_rate(self)
        check_clients(self)
        self._within_point_limit()
        check_point_lengths(self)
        check_baseline_lengths(self)
        return self

    def _unique_names(self) -> None:
        """Backend and sweep names are unique; 'baseline' is the HF baseline's point; at
        most MAX_BACKENDS besides a configuration search's."""
        names = [b.name for b in self.backends]
        own = len(names) - len(self.config_names)
        if own > MAX_BACKENDS:
            raise FieldError("backends", f"at most {MAX_BACKENDS} backends (given {own})")
        for i, name in enumerate(names):
            if name in names[:i]:
                first = names.index(name)
                raise FieldError(
                    f"backends.{i}.name",
                    f"backend names must be unique: {name!r} is also backends.{first}'s name "
                    f"(two backends of one kind need a name each: give this one another "
                    f"name, e.g. {self.backends[i].kind}-{i + 1})",
                )
        sweep_names = [s.name for s in self.sweeps]
        for i, name in enumerate(sweep_names):
            if name in sweep_names[:i]:
                raise FieldError(f"sweeps.{i}.name", f"sweep names must be unique: {name!r}")
            if name == "baseline":
                raise FieldError(
                    f"sweeps.{i}.name", "'baseline' is reserved for the HF baseline point"
                )

    def _within_point_limit(self) -> None:
        """A complete run reports at most MAX_POINTS measurements."""
        npoints = self.total_measurements()
        if npoints > MAX_POINTS:
            raise ValueError(
                f"the spec expands to {npoints} measurements; the limit is {MAX_POINTS}"
            )

    def data_files(self) -> list[tuple[str, str]]:
        """(field, path) of every file the runner reads requests from: the prompts file,
        a trace, a sessions file, the eval file. The portal's path policy and preflight
        check each (one list, so a new file field cannot escape them)."""
        w, c = self.workload, self.correctness
        files = [
            ("workload.dataset_path", w.dataset_path),
            ("workload.trace.path", w.trace.path if w.trace else None),
            ("workload.sessions.path", w.sessions.path if w.sessions else None),
            ("correctness.eval_file", c.eval_file if c else None),
        ]
        return [(field, path) for field, path in files if path]

    @property
    def hf_backends(self) -> list[HFBackend]:
        return [b for b in self.backends if isinstance(b, HFBackend)]

    @property
    def batched_backends(self) -> list[HFBatchedBackend]:
        """The hf-batched baselines, measured at every sweep point like a server."""
        return [b for b in self.backends if isinstance(b, HFBatchedBackend)]

    @property
    def vllm_backends(self) -> list[VLLMBackend]:
        return [b for b in self.backends if isinstance(b, VLLMBackend)]

    @property
    def endpoint_backends(self) -> list[EndpointBackend]:
        return [b for b in self.backends if isinstance(b, EndpointBackend)]

    @property
    def transformers_backends(self) -> list[TransformersServeBackend]:
        return [b for b in self.backends if isinstance(b, TransformersServeBackend)]

    @property
    def served_backends(self) -> list[ServedBackend]:
        """The backends measured at the sweep points through vLLM's bench client: vLLM
        servers, endpoints and transformers serve."""
        return [
            b
            for b in self.backends
            if isinstance(b, VLLMBackend | EndpointBackend | TransformersServeBackend)
        ]

    @property
    def config_names(self) -> list[str]:
        """The configuration search's backend names, in order (empty without one)."""
        return self.config_search.names() if self.config_search else []

    @property
    def config_backends(self) -> list[VLLMBackend]:
        """The configuration search's vllm backends, in the order they are measured."""
        by_name = {b.name: b for b in self.vllm_backends}
        return [by_name[n] for n in self.config_names if n in by_name]

    @property
    def loads_model(self) -> bool:
        """Whether the runner loads the model itself (an HF baseline, a vLLM server,
        transformers serve), rather than only measuring deployed endpoints."""
        return any(not isinstance(b, EndpointBackend) for b in self.backends)

    @property
    def search_backends(self) -> list[ServedBackend]:
        """The backends the SLA search runs on (none without a search)."""
        if self.sla_search is None:
            return []
        wanted = set(self.sla_search.backends)
        return [b for b in self.served_backends if not wanted or b.name in wanted]

    def points(self) -> list[Point]:
        """The sweep points in execution order (a spec with no sweep has one)."""
        return list(_iter_points(self))

    def total_measurements(self) -> int:
        """How many measurements a complete run of this spec reports, at most: an SLA
        search that converges early measures fewer than its max_points
        (``runners.sla.expected_measurements`` counts a finished run's)."""
        at_points = len(self.served_backends) + len(self.batched_backends)
        per_repeat = len(self.hf_backends) + at_points * len(self.points())
        search = self.sla_search.max_points * len(self.search_backends) if self.sla_search else 0
        return per_repeat * self.repeats + search
