"""The benchmark spec: the versioned contract between users, the portal and the runner.

A spec says *what* to measure: which model, which workload, which sweeps, which
backends, how many repeats, within which SLOs and on which resources. It is validated by
pydantic v2; unknown fields are errors, and every error names its field.

``Spec.points()`` turns a spec into the concrete list of sweep points the runner
executes; the portal uses the same method (and ``total_measurements()``) to know how
many measurements a run has.

Everything is imported from here (``from runners.spec import Spec``); each concern lives
in a module of its own:

- ``common``: the ``Strict`` base, ``FieldError``, the limits (``MAX_*``), the checks for
  strings that reach a command line (labels, safe ids and paths), ``json_problem``.
- ``model``: ``ModelSpec``.
- ``workload``: ``Workload``, ``RampUp``, ``Sweep``, ``WorkloadOverrides``; the prompt-file
  and request-rate rules.
- ``backends``: one module per backend kind, each with its own rules: ``hf`` (the
  in-process baselines), ``vllm`` (with its flag allow-list: ``FIELD_FLAGS``,
  ``ALLOWED_EXTRA_FLAGS``, ``check_extra_args``, ``parallel_size``), ``endpoint`` (URL and
  ``APIKey`` rules), ``transformers_serve``; ``base`` (``NamedBackend``, the request APIs);
  the package holds the ``Backend`` union and ``BACKEND_KINDS``.
- ``traffic``: ``Trace``, ``Sessions``, ``Correctness`` (production traffic) and their rules.
- ``search``: ``SLO``, ``SLASearch``, ``slo_text``.
- ``configsearch``: ``ConfigSearch`` (one vllm backend as several configurations) and
  its ``Budget``.
- ``resources``: ``Resources``.
- ``root``: ``Spec`` itself, whose validator calls the rules above in a fixed order.
- ``points``: ``Point``, ``search_point``, ``hf_point``.
- ``presets``: the seed experiments, the tiny demo, ``PRESETS``, ``preset``.
- ``io``: ``SpecError``, ``errors_from``, ``parse_spec``, ``loads_spec``, ``load_spec``,
  ``dump_spec``, ``json_schema``.
- ``yamlload``: ``safe_yaml`` (spec text read as JSON would read it: YAML 1.2 core
  scalars, no duplicate keys, no aliases) and its ``YAMLFieldError``.
"""

from __future__ import annotations

from runners.spec.backends import BACKEND_KINDS, Backend, ServedBackend
from runners.spec.backends.base import API_ENDPOINTS, Api, LoRAAssignment, NamedBackend
from runners.spec.backends.endpoint import APIKey, EndpointBackend, endpoint_url_parts
from runners.spec.backends.hf import HFBackend, HFBatchedBackend, HFStaticCacheBackend
from runners.spec.backends.transformers_serve import TransformersServeBackend
from runners.spec.backends.vllm import (
    ALLOWED_EXTRA_FLAGS,
    FIELD_FLAGS,
    PARALLEL_FLAGS,
    LoRAAdapter,
    VLLMBackend,
    check_extra_args,
    parallel_size,
)
from runners.spec.common import (
    MAX_BACKENDS,
    MAX_CONCURRENCY,
    MAX_JSON_DEPTH,
    MAX_JSON_INT,
    MAX_POINTS,
    MAX_REPEATS,
    MAX_SWEEP_VALUES,
    MAX_SWEEPS,
    SPEC_VERSION,
    DuplicateKeys,
    FieldError,
    Strict,
    free_text_problem,
    json_problem,
    renderable,
    shown,
)
from runners.spec.configsearch import MAX_CONFIGS, Budget, ConfigSearch
from runners.spec.io import (
    SpecError,
    dump_spec,
    errors_from,
    json_schema,
    load_spec,
    loads_spec,
    parse_spec,
    whole_numbers,
)
from runners.spec.model import ModelSpec
from runners.spec.points import Point, hf_point, search_point
from runners.spec.presets import (
    PRESETS,
    TINY_DEMO,
    TINY_DEMO_PRESET,
    preset,
    seed_all_baselines,
    seed_experiment,
    tiny_demo,
)
from runners.spec.resources import Resources
from runners.spec.root import Spec
from runners.spec.search import SEARCH_AXES, SLO, SLO_METRICS, SLASearch, slo_text
from runners.spec.traffic import Correctness, Sessions, Trace
from runners.spec.workload import RampUp, Sweep, SweepAxis, Workload, WorkloadOverrides
from runners.spec.yamlload import YAMLFieldError, safe_yaml

__all__ = [
    "ALLOWED_EXTRA_FLAGS",
    "API_ENDPOINTS",
    "BACKEND_KINDS",
    "FIELD_FLAGS",
    "MAX_BACKENDS",
    "MAX_CONCURRENCY",
    "MAX_CONFIGS",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT",
    "MAX_POINTS",
    "MAX_REPEATS",
    "MAX_SWEEPS",
    "MAX_SWEEP_VALUES",
    "PARALLEL_FLAGS",
    "PRESETS",
    "SEARCH_AXES",
    "SLO",
    "SLO_METRICS",
    "SPEC_VERSION",
    "TINY_DEMO",
    "TINY_DEMO_PRESET",
    "APIKey",
    "Api",
    "Backend",
    "Budget",
    "ConfigSearch",
    "Correctness",
    "DuplicateKeys",
    "EndpointBackend",
    "FieldError",
    "HFBackend",
    "HFBatchedBackend",
    "HFStaticCacheBackend",
    "LoRAAdapter",
    "LoRAAssignment",
    "ModelSpec",
    "NamedBackend",
    "Point",
    "RampUp",
    "Resources",
    "SLASearch",
    "ServedBackend",
    "Sessions",
    "Spec",
    "SpecError",
    "Strict",
    "Sweep",
    "SweepAxis",
    "Trace",
    "TransformersServeBackend",
    "VLLMBackend",
    "Workload",
    "WorkloadOverrides",
    "YAMLFieldError",
    "check_extra_args",
    "dump_spec",
    "endpoint_url_parts",
    "errors_from",
    "free_text_problem",
    "hf_point",
    "json_problem",
    "json_schema",
    "load_spec",
    "loads_spec",
    "parallel_size",
    "parse_spec",
    "preset",
    "renderable",
    "safe_yaml",
    "search_point",
    "seed_all_baselines",
    "seed_experiment",
    "shown",
    "slo_text",
    "tiny_demo",
    "whole_numbers",
]
