"""The benchmark spec: the versioned contract between users, the portal and the runner.

A spec says *what* to measure: which model, which workload, which sweeps, which
backends, how many repeats, within which SLOs and on which resources. It is validated by
pydantic v2; unknown fields are errors, and every error names its field.

``Spec.points()`` turns a spec into the concrete list of sweep points the runner
executes; the portal uses the same method (and ``total_measurements()``) to know how
many measurements a run has.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

SPEC_VERSION = 1

# Strings that end up on a command line (as argv elements, never through a shell) or in
# a Kubernetes object. Allow what hub ids, paths, versions and labels need, nothing more.
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+=\-]*$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./~][A-Za-z0-9._/:@+=\-]*$")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,62}$")


def _label(value: str, what: str) -> str:
    """``value`` when it is a label (sweep, backend, adapter, search names), else a
    ValueError naming ``what``."""
    if not _LABEL.match(value):
        raise ValueError(f"{what} must be 1-63 letters, digits, '.', '_' or '-'")
    return value


_FREE_TEXT_BAD = re.compile(r"[\x00-\x1f\x7f]")

MAX_SWEEP_VALUES = 32
MAX_SWEEPS = 8
MAX_BACKENDS = 8
MAX_REPEATS = 10
MAX_POINTS = 256
MAX_CONCURRENCY = 100_000  # as many as num_prompts may be: "no limit" is expressible
MAX_JSON_DEPTH = 32
MAX_JSON_INT = 2**63 - 1


class FieldError(ValueError):
    """A validation error about a field below the validator that raised it.

    Model-level checks (unique names, lengths against max_model_len) see the whole
    section; ``errors_from`` appends ``field`` to the section's location so the error
    still names the exact field ('sweeps.1.name', not the spec as a whole).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _safe(value: str, what: str, pattern: re.Pattern[str] = _SAFE) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > 256:
        raise ValueError(f"{what} is longer than 256 characters")
    if ".." in value.split("/"):
        raise ValueError(f"{what} must not contain '..' path segments")
    if not pattern.match(value):
        raise ValueError(
            f"{what} {value!r} contains characters that are not allowed "
            "(use letters, digits and . _ - / : @ + =; no spaces or shell metacharacters)"
        )
    return value


class Strict(BaseModel):
    """Base for every spec section: unknown fields are errors, assignments re-validate,
    and numbers are finite (``1e400``, YAML's ``.inf`` and NaN are errors, not values)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def json_problem(value: Any, path: str = "", depth: int = 0) -> tuple[str, str] | None:
    """The first part of a parsed JSON/YAML value that cannot be stored and shown safely:
    (dotted path, why), or None. Refused: NUL characters and lone surrogates in strings
    (PostgreSQL cannot store them), non-finite numbers, integers beyond 64 bits, nesting
    deeper than MAX_JSON_DEPTH, and anything that is not a JSON type.

    The portal checks specs and runner payloads with it before anything else reads them.
    """
    if isinstance(value, str):
        if "\x00" in value:
            return path, "text must not contain NUL characters"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path, "text must be valid Unicode (a lone surrogate is not)"
        return None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        if abs(value) > MAX_JSON_INT:
            return path, "integer out of range (at most 64 bits)"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, "number must be finite (not inf or NaN)")
    if depth >= MAX_JSON_DEPTH:
        return path, f"nested more than {MAX_JSON_DEPTH} levels deep"
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if not isinstance(key, str):
                return path, f"keys must be strings, not {type(key).__name__}"
            problem = json_problem(key, where, depth + 1) or json_problem(item, where, depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            problem = json_problem(item, f"{path}.{i}" if path else str(i), depth + 1)
            if problem:
                return problem
        return None
    return path, f"a {type(value).__name__} is not a JSON value"


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


def _without_defaults(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the keys whose value is the given default: fields added after
    runs were stored stay out of dumps (and so out of every stored fingerprint) until a
    spec sets them."""
    return {k: v for k, v in data.items() if k not in defaults or v != defaults[k]}


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


class NamedBackend(Strict):
    """What every backend kind has: a name, unique in the spec, shown on every page."""

    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _label(v, "backend name")


class HFBackend(NamedBackend):
    """The naive baseline: one request at a time through transformers' generate()."""

    kind: Literal["hf-sequential"] = "hf-sequential"
    name: str = "hf-sequential"
    num_prompts: int = Field(
        16, ge=1, le=10_000, description="Requests to time (sequential, so keep it modest)."
    )
    input_len: int | None = Field(None, ge=1, description="Defaults to the workload's.")
    output_len: int | None = Field(None, ge=1, description="Defaults to the workload's.")
    num_warmups: int = Field(1, ge=0, le=100)
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None


class HFStaticCacheBackend(HFBackend):
    """The sequential baseline with generate()'s static KV cache and a torch.compile'd
    forward (``runners.hf_baselines``); compile time is recorded apart."""

    kind: Literal["hf-static-cache"] = "hf-static-cache"  # type: ignore[assignment]
    name: str = "hf-static-cache"
    compile_backend: Literal["inductor", "aot_eager"] = Field(
        "inductor", description="torch.compile backend (aot_eager: no code generation)."
    )


class HFBatchedBackend(NamedBackend):
    """An optimized batch-generation script: at each sweep point, the point's prompts
    through generate() in static padded batches of the point's concurrency
    (``runners.hf_baselines``)."""

    kind: Literal["hf-batched"] = "hf-batched"
    name: str = "hf-batched"
    num_warmups: int = Field(1, ge=0, le=100)
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] | None = None


# The runner sets these itself: the bench client must find the server, under the model's
# name, without a key (and a key on a command line would be a leaked secret).
_RESERVED_SERVE_FLAGS = ("--host", "--port", "--model", "--served-model-name", "--api-key")

# Flags that have a spec field of their own: the field is what the portal checks (remote
# code needs an admin's permission), compares (the fingerprint) and shows.
FIELD_FLAGS = {
    "--dtype": "model.dtype",
    "--max-model-len": "model.max_model_len",
    "--revision": "model.revision",
    "--tokenizer": "model.tokenizer",
    "--trust-remote-code": "model.trust_remote_code",
    "--no-trust-remote-code": "model.trust_remote_code",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--kv-cache-dtype": "kv_cache_dtype",
    "--enable-prefix-caching": "enable_prefix_caching",
    "--no-enable-prefix-caching": "enable_prefix_caching",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-num-seqs": "max_num_seqs",
    "--quantization": "quantization",
    "-q": "quantization",
    "--block-size": "block_size",
    "--enforce-eager": "enforce_eager",
    "--no-enforce-eager": "enforce_eager",
    "--speculative-config": "speculative_config",
    "--enable-lora": "lora_adapters",
    "--lora-modules": "lora_adapters",
    "--max-loras": "lora_adapters",
    "--max-lora-rank": "max_lora_rank",
}

# The only `vllm serve` flags extra_args may carry: engine tuning that reads no file, loads
# no code, opens no address and has no spec field. Exact spellings only (vLLM's parser
# also takes unique prefixes, so `--ho` would be `--host`; '_' for '-' is accepted as
# vLLM accepts it). tests/runners/test_spec.py checks each is a real vLLM flag and that
# whatever passes leaves the runner's own settings alone under vLLM's parser.
ALLOWED_EXTRA_FLAGS = frozenset(
    {
        # scheduling and batching
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--long-prefill-token-threshold",
        "--scheduling-policy",
        "--async-scheduling",
        "--no-async-scheduling",
        "--stream-interval",
        "--max-logprobs",
        # memory and the KV cache
        "--cpu-offload-gb",
        "--kv-cache-memory-bytes",
        "--num-gpu-blocks-override",
        "--disable-hybrid-kv-cache-manager",
        "--no-disable-hybrid-kv-cache-manager",
        "--disable-sliding-window",
        "--no-disable-sliding-window",
        "--prefix-caching-hash-algo",
        "--mamba-ssm-cache-dtype",
        "--mamba-cache-dtype",
        # kernels and compilation
        "--optimization-level",
        "--max-cudagraph-capture-size",
        "--cudagraph-capture-sizes",
        "--attention-backend",
        "--disable-cascade-attn",
        "--no-disable-cascade-attn",
        "--disable-custom-all-reduce",
        "--no-disable-custom-all-reduce",
        # parallelism beyond tensor parallelism (counted against resources.gpu_count)
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--enable-expert-parallel",
        "--no-enable-expert-parallel",
        "--enable-eplb",
        "--no-enable-eplb",
        "--enable-dbo",
        "--no-enable-dbo",
        # loading
        "--seed",
        "--max-parallel-loading-workers",
        "--safetensors-load-strategy",
    }
)
# Flags whose value multiplies the GPUs one server uses (with tensor_parallel_size).
PARALLEL_FLAGS = ("--pipeline-parallel-size", "--data-parallel-size")


def _flag_name(arg: str) -> str:
    """The flag an argv element names, spelled as vLLM's parser reads it ('_' -> '-')."""
    key = arg.split("=", 1)[0]
    return "--" + key[2:].replace("_", "-") if key.startswith("--") else key


def check_extra_args(args: list[str]) -> None:
    """FieldError (field: the element's index) unless every element of ``args`` is an
    allowed flag (ALLOWED_EXTRA_FLAGS, exact spelling) or a plain value after one."""
    for i, arg in enumerate(args):
        try:
            _safe(arg.lstrip("-") or "-", "extra argument")
        except ValueError as exc:
            raise FieldError(str(i), str(exc)) from None
        if not arg.startswith("-"):
            if i == 0:
                raise FieldError(str(i), f"extra_args must start with a flag, not {arg!r}")
            continue
        flag = _flag_name(arg)
        if flag in ALLOWED_EXTRA_FLAGS:
            continue
        if len(flag) > 3 and any(r.startswith(flag) for r in _RESERVED_SERVE_FLAGS):
            # vLLM takes a unique prefix for the whole flag: '--ho' is '--host'.
            raise FieldError(str(i), f"extra argument {flag!r} is set by the runner")
        if flag in FIELD_FLAGS:
            raise FieldError(
                str(i),
                f"extra argument {flag!r} has a spec field of its own: set "
                f"{FIELD_FLAGS[flag]} instead",
            )
        raise FieldError(
            str(i),
            f"extra argument {flag!r} is not one servebench passes to vLLM (exact spellings "
            "only; the allowed flags are listed in the spec schema, `python -m runners "
            "schema`, under extra_args)",
        )


def parallel_size(args: list[str], flag: str) -> int:
    """The value ``args`` give ``flag`` (``--flag N`` or ``--flag=N``); 1 if absent."""
    value = "1"
    for i, arg in enumerate(args):
        if _flag_name(arg) != flag:
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif i + 1 < len(args):
            value = args[i + 1]
    return int(value) if value.isdecimal() and len(value) < 6 else 0


class LoRAAdapter(Strict):
    """A LoRA adapter served next to the base model, requested by its name."""

    name: str = Field(description="The name requests use (the served adapter's model name).")
    path: str = Field(description="Hub id or local directory of a PEFT LoRA adapter.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _label(v, "adapter name")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return _safe(v, "adapter path", _SAFE_PATH)


Api = Literal["completions", "chat"]
LoRAAssignment = Literal["random", "round-robin"]
API_ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# VLLMBackend fields added after runs were stored, at their defaults: left out of
# server_config() (and so of stored fingerprints) until a spec sets them.
_ADDED_VLLM_DEFAULTS: dict[str, Any] = {
    "api": "completions",
    "lora_adapters": [],
    "max_lora_rank": None,
    "lora_assignment": "random",
}
# What a server is started with does not depend on these (one server serves both APIs).
_REQUEST_ONLY_FIELDS = ("api", "lora_assignment")


class VLLMBackend(NamedBackend):
    """A vLLM OpenAI-compatible server, measured with vLLM's own bench client."""

    kind: Literal["vllm"] = "vllm"
    name: str = "vllm"
    api: Api = Field(
        "completions",
        description="'completions' (/v1/completions) or 'chat' (/v1/chat/completions: the "
        "server applies the model's chat template).",
    )
    lora_adapters: list[LoRAAdapter] = Field(
        default_factory=list,
        max_length=16,
        description="LoRA adapters served with the base model (--enable-lora); requests are "
        "spread over them (lora_assignment).",
    )
    max_lora_rank: int | None = Field(None, ge=1, le=1024, description="--max-lora-rank.")
    lora_assignment: LoRAAssignment = Field(
        "random", description="How requests pick an adapter: 'random' or 'round-robin'."
    )
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    enable_prefix_caching: bool = Field(
        False,
        description=(
            "Off by default: repeated points re-send the same prompts and a warm prefix "
            "cache would inflate them. When on, the cache is reset between points."
        ),
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1, le=65_536)
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    quantization: str | None = None
    block_size: int | None = Field(None, ge=1, le=1024)
    enforce_eager: bool = False
    speculative_config: dict[str, Any] | None = Field(
        None, description="Passed to --speculative-config as JSON."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=32,
        description=(
            "Further `vllm serve` flags, one argv element each (no shell), from this list: "
            + ", ".join(sorted(ALLOWED_EXTRA_FLAGS))
            + ". Flags with a spec field of their own (dtype, tensor parallelism, remote "
            "code...) are set through that field."
        ),
    )
    startup_timeout_s: int = Field(900, ge=10, le=7200)

    @field_validator("quantization")
    @classmethod
    def _quant(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "quantization")

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        check_extra_args(v)
        for flag in PARALLEL_FLAGS:
            if parallel_size(v, flag) < 1:
                raise ValueError(f"{flag} needs a whole number of at least 1")
        return v

    @model_validator(mode="after")
    def _adapters(self) -> VLLMBackend:
        names = [a.name for a in self.lora_adapters]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise FieldError(f"lora_adapters.{i}.name", f"adapter name {name!r} is used twice")
        if self.max_lora_rank is not None and not self.lora_adapters:
            raise FieldError("max_lora_rank", "max_lora_rank needs lora_adapters")
        return self

    @property
    def gpus_per_server(self) -> int:
        """GPUs one server of this configuration uses: tensor x pipeline x data parallel."""
        size = self.tensor_parallel_size
        for flag in PARALLEL_FLAGS:
            size *= parallel_size(self.extra_args, flag)
        return size

    def server_config(self) -> dict[str, Any]:
        """The engine configuration (everything but the name): what the fingerprint
        compares. Fields added later appear only when set."""
        data = self.model_dump(mode="json", exclude={"name", "kind", "startup_timeout_s"})
        return _without_defaults(data, _ADDED_VLLM_DEFAULTS)

    def server_key(self) -> dict[str, Any]:
        """What needs a server of its own: the engine configuration without the request
        settings (one server answers completions and chat, any adapter assignment)."""
        return {k: v for k, v in self.server_config().items() if k not in _REQUEST_ONLY_FIELDS}

    @property
    def lora_names(self) -> list[str]:
        return [a.name for a in self.lora_adapters]


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_URL = re.compile(
    r"^(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?)"
    r"(?::(?P<port>[0-9]{1,5}))?(?P<path>(?:/[A-Za-z0-9._~\-]+)*)/?$"
)


def endpoint_url_parts(url: str) -> dict[str, str] | None:
    """scheme, host (lowercase), port and path of an endpoint URL, or None when it is not
    one (credentials, queries and fragments are never part of one)."""
    match = _URL.match(url)
    if not match:
        return None
    parts = match.groupdict()
    scheme = parts["scheme"]
    return {
        "scheme": scheme,
        "host": parts["host"].lower(),
        "port": parts["port"] or ("443" if scheme == "https" else "80"),
        "path": parts["path"] or "",
    }


class APIKey(Strict):
    """Where the runner finds an endpoint's API key: never the key itself.

    ``env``: an environment variable of the runner. ``secret``: a Kubernetes Secret in the
    runner's namespace (and ``key`` in it), given to the runner Pod as an environment
    variable (``EndpointBackend.key_env``). The key is sent as ``Authorization: Bearer``.
    """

    env: str | None = Field(None, description="Environment variable holding the key.")
    secret: str | None = Field(None, description="Kubernetes Secret holding the key.")
    key: str = Field("api-key", description="The key inside the Secret.")

    @field_validator("env")
    @classmethod
    def _env(cls, v: str | None) -> str | None:
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError("env must be an environment variable name (letters, digits, _)")
        return v

    @field_validator("secret")
    @classmethod
    def _secret(cls, v: str | None) -> str | None:
        if v is not None and not _SECRET_NAME.match(v):
            raise ValueError("secret must be a Kubernetes Secret name (lowercase DNS subdomain)")
        return v

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if not re.match(r"^[-._A-Za-z0-9]{1,253}$", v):
            raise ValueError("key must be a Secret key (letters, digits, '-', '_', '.')")
        return v

    @model_validator(mode="after")
    def _one(self) -> APIKey:
        if (self.env is None) == (self.secret is None):
            raise ValueError("api_key needs exactly one of env (a variable) or secret")
        return self


class EndpointBackend(NamedBackend):
    """An OpenAI-compatible server that is already deployed (vLLM, SGLang, TGI, a gateway):
    no server is started and no GPU requested; measured by vLLM's bench client."""

    kind: Literal["endpoint"] = "endpoint"
    name: str = "endpoint"
    base_url: str = Field(
        description="The server's root URL, without /v1 (requests go to BASE/v1/...), e.g. "
        "http://vllm.prod.svc.cluster.local:8000. No credentials in it: use api_key.",
        examples=["http://vllm.prod.svc.cluster.local:8000"],
    )
    model: str | None = Field(
        None, description="The served model name requests carry; model.id when left out."
    )
    api: Api = Field("completions", description="'completions' or 'chat'.")
    api_key: APIKey | None = Field(
        None, description="Where the runner finds the key (a variable or a Secret), if any."
    )
    request_fields: Literal["vllm", "openai", "transformers"] = Field(
        "vllm",
        description="'vllm': vLLM's bench client as is (it sends vLLM's extra fields: "
        "repetition_penalty, ignore_eos, top_k; vLLM and SGLang accept them). 'openai': "
        "only fields of the OpenAI API are sent, for servers that refuse others (TGI's "
        "Messages API, strict gateways); output lengths can then not be forced, and each "
        "measurement says how many responses came back shorter. 'transformers': OpenAI "
        "fields plus transformers serve's generation_config, which forces output lengths "
        "and carries top_k.",
    )
    lora_modules: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Adapter names this endpoint serves; requests are spread over them.",
    )
    lora_assignment: LoRAAssignment = "random"

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if len(v) > 512:
            raise ValueError("base_url is longer than 512 characters")
        if "@" in v:
            raise ValueError("base_url must not carry credentials; use api_key")
        parts = endpoint_url_parts(v)
        if parts is None:
            raise ValueError(
                "base_url must be http(s)://host[:port][/path] without query, fragment or "
                "spaces, e.g. http://vllm.prod.svc.cluster.local:8000"
            )
        if parts["path"].rstrip("/").endswith("/v1"):
            raise ValueError("leave /v1 out of base_url: requests go to BASE/v1/completions")
        if not 0 < int(parts["port"]) < 65536:
            raise ValueError("base_url's port must be between 1 and 65535")
        return v.rstrip("/")

    @field_validator("model")
    @classmethod
    def _model(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "served model name", _SAFE_PATH)

    @field_validator("lora_modules")
    @classmethod
    def _loras(cls, v: list[str]) -> list[str]:
        for name in v:
            if not _LABEL.match(name):
                raise ValueError("adapter names are 1-63 letters, digits, '.', '_' or '-'")
        if len(set(v)) != len(v):
            raise ValueError("adapter names must be unique")
        return v

    @property
    def host(self) -> str:
        parts = endpoint_url_parts(self.base_url)
        assert parts is not None  # validated
        return parts["host"]

    @property
    def lora_names(self) -> list[str]:
        return list(self.lora_modules)

    def key_env(self) -> str | None:
        """The environment variable the runner reads this endpoint's key from: the named
        one, or for a Secret ``SERVEBENCH_ENDPOINT_KEY_<NAME>_<hash>`` (the Kubernetes Job
        sets it from the Secret; the hash keeps 'a-b' and 'a_b' apart)."""
        if self.api_key is None:
            return None
        if self.api_key.env is not None:
            return self.api_key.env
        stem = re.sub(r"[^A-Z0-9]", "_", self.name.upper())
        digest = hashlib.sha256(self.name.encode()).hexdigest()[:6].upper()
        return f"SERVEBENCH_ENDPOINT_KEY_{stem}_{digest}"

    def server_config(self) -> dict[str, Any]:
        """What the fingerprint compares: the target and how it is asked (not the key)."""
        return self.model_dump(mode="json", exclude={"name", "kind", "api_key"})


class TransformersServeBackend(NamedBackend):
    """Transformers' own OpenAI-compatible server (``transformers serve``), started and
    stopped by the runner like a vLLM server and measured at the same points with the same
    client and metric definitions (``runners.transformers_server``). Output lengths are
    forced as vLLM's ``ignore_eos`` forces them, through the server's ``generation_config``
    request field, and checked per request."""

    kind: Literal["transformers-serve"] = "transformers-serve"
    name: str = "transformers-serve"
    api: Api = Field("completions", description="'completions' or 'chat'.")
    continuous_batching: bool = Field(
        True,
        description="--continuous-batching (paged attention, requests batched as they "
        "come) or, when false, one generate() call at a time.",
    )
    compile: bool = Field(False, description="--compile: static cache and torch.compile.")
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "sdpa_paged"] | None = Field(
        None, description="--attn-implementation (the server's default when left out)."
    )
    cb_num_blocks: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="--cb-num-blocks: KV-cache blocks for continuous batching (the server "
        "sizes the cache from free memory when left out; on CPU, set it).",
    )
    cb_block_size: int | None = Field(None, ge=1, le=1024, description="--cb-block-size.")
    cb_max_batch_tokens: int | None = Field(
        None, ge=1, le=10_000_000, description="--cb-max-batch-tokens."
    )
    startup_timeout_s: int = Field(600, ge=10, le=7200)

    @model_validator(mode="after")
    def _batching(self) -> TransformersServeBackend:
        if not self.continuous_batching:
            for key in ("cb_num_blocks", "cb_block_size", "cb_max_batch_tokens"):
                if getattr(self, key) is not None:
                    raise FieldError(key, f"{key} needs continuous_batching: true")
        return self

    @property
    def request_fields(self) -> str:
        """How the bench client asks it: OpenAI fields plus its ``generation_config``."""
        return "transformers"

    @property
    def lora_names(self) -> list[str]:
        return []

    def server_config(self) -> dict[str, Any]:
        """What the fingerprint compares: the server's options and the API asked."""
        return self.model_dump(mode="json", exclude={"name", "kind", "startup_timeout_s"})


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
        max_length=MAX_BACKENDS,
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
                raise FieldError(
                    key, f"{key!r} is not a latency metric; use one of {', '.join(SLO_METRICS)}"
                )
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
        max_length=MAX_BACKENDS,
    )
    repeats: int = Field(1, ge=1, le=MAX_REPEATS)
    slo: SLO | None = None
    sla_search: SLASearch | None = Field(
        None,
        description="Find the highest request rate or concurrency that meets an SLO "
        "(an adaptive search of at most max_points points per backend).",
    )
    resources: Resources = Field(default_factory=Resources)

    @field_validator("name")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        if v is not None and _FREE_TEXT_BAD.search(v):
            raise ValueError("name must not contain control characters")
        return v

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_defaults(handler(self), {"sla_search": None})

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Spec:
        names = [b.name for b in self.backends]
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
        self._dataset_rules()
        self._parallelism_rules()
        self._endpoint_rules()
        self._transformers_rules()
        self._search_rules()
        if (info.context or {}).get("stored"):
            self._stored = True
        if not self._stored:
            # Refusals added after runs were accepted: a stored run's spec stays readable.
            self._batched_rules()
        self._unlimited_concurrency_under_a_rate()
        npoints = self.total_measurements()
        if npoints > MAX_POINTS:
            raise ValueError(
                f"the spec expands to {npoints} measurements; the limit is {MAX_POINTS}"
            )
        sweep_index = {s.name: i for i, s in enumerate(self.sweeps)}
        search = self.sla_search
        checked = self.points() + ([search_point(self, search.low)] if search else [])
        generated = self.workload.dataset in ("random", "prefix_repetition")
        for point in checked:
            total = point.input_len + point.output_len + self.workload.prefix_len
            if point.num_prompts < self.workload.num_prefixes and (
                self.workload.dataset == "prefix_repetition"
            ):
                raise FieldError(
                    "workload.num_prefixes",
                    f"point {point.key}: num_prompts {point.num_prompts} is below num_prefixes "
                    f"{self.workload.num_prefixes}; every prefix needs a prompt",
                )
            if generated and total > self.model.max_model_len:
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
                    f"exceeds model.max_model_len {self.model.max_model_len}",
                )
        for i, b in enumerate(self.backends):
            if not isinstance(b, HFBackend) or not generated:
                continue  # a prompt file's prompts have the lengths they have
            total = (b.input_len or self.workload.input_len) + (
                b.output_len or self.workload.output_len
            )
            if total > self.model.max_model_len:
                raise FieldError(
                    f"backends.{i}.input_len",
                    f"backend {b.name!r}: input_len + output_len = {total} exceeds "
                    f"model.max_model_len {self.model.max_model_len}",
                )
        return self

    def _dataset_rules(self) -> None:
        """The HF baseline must send the prompts the servers get: random ones of input_len
        tokens, or the custom file's (in file order, with the chat template when the
        servers are asked through chat), greedily. ShareGPT and prefix-repetition prompts
        it cannot reproduce, sampling it does not do. A file's prompts make input_len
        meaningless."""
        w = self.workload
        hf = [i for i, b in enumerate(self.backends) if isinstance(b, HFBackend | HFBatchedBackend)]
        if hf and w.dataset in ("sharegpt", "prefix_repetition"):
            raise FieldError(
                f"backends.{hf[0]}.kind",
                f"the HF baseline cannot send the {w.dataset} prompts of the other backends "
                "(it sends random prompts of input_len tokens, or a custom JSONL file's), so "
                "the two would not compare; remove the hf-sequential backend or use dataset "
                "'random' or 'custom'",
            )
        if hf and not w.greedy:
            field = "temperature" if w.temperature != 0 else "top_p" if w.top_p else "top_k"
            raise FieldError(
                f"workload.{field}",
                "the HF baseline decodes greedily, so sampled requests to the other backends "
                "would not compare with it; remove the hf-sequential backend or sample "
                "greedily (temperature 0, no top_p or top_k)",
            )
        if hf and w.dataset == "custom" and len({b.api for b in self.served_backends}) > 1:
            first = next(
                i for i, b in enumerate(self.backends) if getattr(b, "api", None) == "chat"
            )
            raise FieldError(
                f"backends.{first}.api",
                "with a custom prompt file the HF baseline sends the prompts as the servers "
                "get them (the chat template applied when they are asked through chat), so "
                "every vllm and endpoint backend must use the same api",
            )
        if w.dataset not in ("sharegpt", "custom"):
            return
        for i, sweep in enumerate(self.sweeps):
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

    def _parallelism_rules(self) -> None:
        """A server may not use more GPUs than the run asks for (a CPU run: one)."""
        gpus = self.resources.gpu_count
        for i, b in enumerate(self.backends):
            if not isinstance(b, VLLMBackend) or b.gpus_per_server <= max(gpus, 1):
                continue
            field = (
                "tensor_parallel_size" if b.tensor_parallel_size > max(gpus, 1) else "extra_args"
            )
            raise FieldError(
                f"backends.{i}.{field}",
                f"backend {b.name!r} uses {b.gpus_per_server} GPUs (tensor x pipeline x data "
                f"parallel) but resources.gpu_count is {gpus}; raise resources.gpu_count or "
                "lower the parallelism",
            )

    def _endpoint_rules(self) -> None:
        """Endpoints get what they can take; a spec of only endpoints needs no GPU."""
        w = self.workload
        for b in self.backends:
            if isinstance(b, EndpointBackend) and b.request_fields == "openai" and w.top_k:
                raise FieldError(
                    "workload.top_k",
                    f"endpoint {b.name!r} takes only OpenAI fields (request_fields: openai), "
                    "and top_k is not one; leave top_k out or set request_fields: vllm",
                )
        if not self.backends or any(not isinstance(b, EndpointBackend) for b in self.backends):
            return
        if "gpu_count" not in self.resources.model_fields_set:
            # Written into the spec as executed: the runner Job asks for no GPU.
            self.resources = self.resources.model_copy(update={"gpu_count": 0})
        elif self.resources.gpu_count > 0:
            raise FieldError(
                "resources.gpu_count",
                "every backend is an endpoint: the runner starts no server and needs no GPU; "
                "set gpu_count to 0 or leave it out",
            )

    def _transformers_rules(self) -> None:
        """What ``transformers serve`` cannot be given: it loads the model's own tokenizer
        and names a model ``id@revision``."""
        i = next(
            (i for i, b in enumerate(self.backends) if isinstance(b, TransformersServeBackend)),
            None,
        )
        if i is None:
            return
        name = self.backends[i].name
        if self.model.tokenizer:
            raise FieldError(
                "model.tokenizer",
                f"backend {name!r} (transformers serve) loads the model's own tokenizer and "
                "has no option for another; leave model.tokenizer out or remove the backend",
            )
        if "@" in self.model.id:
            raise FieldError(
                "model.id",
                f"backend {name!r} (transformers serve) reads '@' in a model id as the "
                "start of a revision; put the revision in model.revision",
            )

    def _search_rules(self) -> None:
        search = self.sla_search
        if search is None:
            return
        if search.name == "baseline" or search.name in {s.name for s in self.sweeps}:
            raise FieldError(
                "sla_search.name",
                f"{search.name!r} is taken by a sweep (or the HF baseline); name the search "
                "otherwise",
            )
        served = {b.name for b in self.served_backends}
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
        if search.axis == "request_rate" and self.workload.ramp_up is not None:
            raise FieldError(
                "sla_search.axis",
                "a request_rate search sets the rate of each point; remove workload.ramp_up",
            )
        if search.axis == "request_rate" and search.fixed.max_concurrency is None:
            # As under a request_rate sweep: the arrivals set the load, not a cap.
            prompts = search.fixed.num_prompts or self.workload.num_prompts
            search.fixed = search.fixed.model_copy(update={"max_concurrency": prompts})
        if search.axis == "max_concurrency" and self.workload.ramp_up is not None:
            raise FieldError(
                "sla_search.axis",
                "a max_concurrency search sends every request at once; remove "
                "workload.ramp_up, or search on request_rate",
            )

    def _batched_rules(self) -> None:
        """hf-batched runs static batches of a point's concurrency back to back: it cannot
        follow a request rate. At a point whose requests arrive at a rate (a request_rate
        sweep or search, a rate or ramp-up for every point), its batch would be the
        client's concurrency cap (all the prompts at once, under a rate), and its numbers
        beside the rate-limited servers' would read as the same load when they are not."""
        batched = [i for i, b in enumerate(self.backends) if isinstance(b, HFBatchedBackend)]
        if not batched:
            return
        w = self.workload
        where = None
        if w.request_rate is not None:
            where = "workload.request_rate"
        elif w.ramp_up is not None:
            where = "workload.ramp_up"
        for i, sweep in enumerate(self.sweeps):
            if where is None and sweep.axis == "request_rate":
                where = f"sweeps.{i}.axis"
            elif where is None and sweep.fixed.request_rate is not None:
                where = f"sweeps.{i}.fixed.request_rate"
        if where is None:
            return
        raise FieldError(
            where,
            f"hf-batched (backends.{batched[0]}) runs static batches back to back and cannot "
            "send requests at a rate, so its numbers at these points would not be measured "
            "under the load the servers get; remove the hf-batched backend, or measure it in "
            "a spec whose sweeps send every request at once (a max_concurrency, input_len or "
            "output_len sweep without a request rate)",
        )

    def _unlimited_concurrency_under_a_rate(self) -> None:
        """Under a request rate the arrivals set the load: unless the spec caps it, the
        client's concurrency is unlimited (num_prompts), written into the spec so the
        spec as executed says so (the default of 1 would silently serialise the rate).
        The same under a ramp-up of the rate."""
        w = self.workload
        for i, sweep in enumerate(self.sweeps):
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
        if "max_concurrency" in self.workload.model_fields_set:
            return
        if (w.request_rate is not None or w.ramp_up is not None) and (
            w.max_concurrency < w.num_prompts
        ):
            self.workload = w.model_copy(update={"max_concurrency": w.num_prompts})
        for sweep in self.sweeps:
            if sweep.axis != "request_rate" or sweep.fixed.max_concurrency is not None:
                continue
            prompts = sweep.fixed.num_prompts or self.workload.num_prompts
            sweep.fixed = sweep.fixed.model_copy(update={"max_concurrency": prompts})

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


# --------------------------------------------------------------------------- presets


def seed_experiment() -> Spec:
    """The seed tutorial's experiment, exactly: Qwen3-0.6B, bf16, 4096 context; three sweeps."""
    return Spec(
        name="Seed experiment: Qwen3-0.6B, HF sequential vs vLLM",
        model=ModelSpec(id="Qwen/Qwen3-0.6B", dtype="bfloat16", max_model_len=4096),
        workload=Workload(
            input_len=1024,
            output_len=128,
            num_prompts=256,
            ignore_eos=True,
            num_warmups=8,
            max_concurrency=64,
        ),
        sweeps=[
            Sweep(name="concurrency", axis="max_concurrency", values=[1, 4, 16, 64]),
            Sweep(name="prompt-length", axis="input_len", values=[128, 1024, 2048]),
            Sweep(name="output-length", axis="output_len", values=[32, 128, 512, 1024]),
        ],
        backends=[HFBackend(input_len=1024, output_len=128), VLLMBackend()],
    )


def seed_all_baselines() -> Spec:
    """The seed experiment against every Hugging Face baseline: the sequential loop, the
    static-cache compiled loop, static batches of each point's concurrency, and
    Transformers' own server with continuous batching."""
    seed = seed_experiment()
    return Spec(
        name="Seed experiment: Qwen3-0.6B, every HF baseline vs vLLM",
        model=seed.model,
        workload=seed.workload,
        sweeps=seed.sweeps,
        backends=[
            HFBackend(input_len=1024, output_len=128),
            HFStaticCacheBackend(input_len=1024, output_len=128),
            HFBatchedBackend(),
            TransformersServeBackend(name="transformers-serve-cb"),
            VLLMBackend(),
        ],
    )


def tiny_demo(model_dir: str) -> Spec:
    """A CPU-sized run on the tiny test model: the demo and the end-to-end tests use it."""
    return Spec(
        name="Tiny model demo (CPU)",
        model=ModelSpec(id=model_dir, dtype="bfloat16", max_model_len=2048),
        workload=Workload(input_len=128, output_len=32, num_prompts=32, num_warmups=2),
        sweeps=[Sweep(name="concurrency", axis="max_concurrency", values=[1, 4, 16])],
        backends=[HFBackend(num_prompts=8), VLLMBackend()],
        resources=Resources(gpu_count=0, timeout_minutes=30),
    )


PRESETS: dict[str, dict[str, Any]] = {
    "seed": {
        "title": "Seed experiment (Qwen3-0.6B)",
        "description": (
            "HF sequential baseline vs vLLM: concurrency 1/4/16/64 at 1024 in / 128 out, "
            "prompt length 128/1024/2048 at concurrency 64, output length 32/128/512/1024; "
            "256 prompts, ignore-eos, 8 warm-ups."
        ),
        "build": seed_experiment,
    },
    "seed-all-baselines": {
        "title": "Seed experiment, every HF baseline (Qwen3-0.6B)",
        "description": (
            "The seed experiment against hf-sequential, hf-static-cache (static KV cache, "
            "torch.compile), hf-batched (static batches of each point's concurrency) and "
            "transformers serve with continuous batching, at vLLM's points."
        ),
        "build": seed_all_baselines,
    },
}

# A preset that needs a model directory (the tiny model, built offline): offered by a portal
# that knows where that directory is (SERVEBENCH_TINY_MODEL_DIR), built with ``tiny_demo``.
TINY_DEMO = "tiny-demo"
TINY_DEMO_PRESET: dict[str, str] = {
    "title": "Tiny demo model (CPU, a few minutes)",
    "description": (
        "The tiny random Qwen3-shaped model built offline: HF sequential baseline (8 "
        "prompts) and vLLM at concurrency 1/4/16, 128 in / 32 out, 32 prompts; no GPU."
    ),
}


def preset(name: str) -> Spec:
    """A preset by name; KeyError names the ones that exist."""
    try:
        return PRESETS[name]["build"]()
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None


# --------------------------------------------------------------------------- I/O


class SpecError(ValueError):
    """A spec that does not validate. ``errors`` is a list of {field, message}."""

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = errors
        first = errors[0]
        where = f"{first['field']}: " if first["field"] else ""
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"{where}{first['message']}{more}")


BACKEND_KINDS = (
    "hf-sequential",
    "hf-static-cache",
    "hf-batched",
    "vllm",
    "endpoint",
    "transformers-serve",
)


def errors_from(exc: ValidationError) -> list[dict[str, str]]:
    """Flatten pydantic errors to {field: 'a.b.0.c', message} with readable text."""
    out = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"] if p not in BACKEND_KINDS]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            loc.append(cause.field)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        elif msg.startswith("Assertion failed, "):
            msg = msg[len("Assertion failed, ") :]
        out.append({"field": ".".join(loc), "message": msg})
    return out


def parse_spec(data: Any, *, stored: bool = False) -> Spec:
    """Validate a mapping (already parsed JSON/YAML) into a Spec, raising SpecError.

    ``stored``: the spec of a run accepted earlier (pages, ingestion, compare). Refusals
    added since then (the spec's ``_consistent`` names them) are not applied to it again,
    so tightening a rule for new submissions never makes an old run unreadable."""
    if not isinstance(data, dict):
        raise SpecError([{"field": "", "message": "a spec must be a mapping (JSON object)"}])
    problem = json_problem(data)
    if problem:
        raise SpecError([{"field": problem[0], "message": problem[1]}])
    try:
        return Spec.model_validate(data, context={"stored": stored})
    except ValidationError as exc:
        raise SpecError(errors_from(exc)) from None


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without anchors and aliases: a few hundred bytes of nested aliases expand
    to gigabytes ("billion laughs"), and a spec never needs them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, "YAML aliases (*name) are not accepted", event.start_mark
            )
        return super().compose_node(parent, index)


def safe_yaml(text: str) -> Any:
    """Parse YAML or JSON text the way every spec reader must: safe types, no aliases.

    Raises yaml.YAMLError with a problem_mark when the position is known; nesting too
    deep and numbers Python cannot read (an integer of thousands of digits) are YAML
    errors too, never anything else.
    """
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # int('9' * 5000) in the int constructor
        raise yaml.YAMLError(f"a value cannot be read: {str(exc)[:120]}") from None


def loads_spec(text: str) -> Spec:
    """Parse YAML or JSON text (JSON is YAML) into a Spec, raising SpecError."""
    if len(text) > 1_000_000:
        raise SpecError([{"field": "", "message": "the spec is larger than 1 MB"}])
    try:
        data = safe_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError([{"field": "", "message": f"not valid YAML or JSON{where}"}]) from None
    return parse_spec(data)


def load_spec(path: str | Path) -> Spec:
    """Read a YAML or JSON spec file."""
    return loads_spec(Path(path).read_text(encoding="utf-8"))


def dump_spec(spec: Spec, fmt: Literal["yaml", "json"] = "yaml") -> str:
    data = spec.model_dump(mode="json", exclude_none=True)
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the spec, exported from the pydantic model."""
    schema = Spec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://servebench.dev/schema/spec-v{SPEC_VERSION}.json"
    return schema
