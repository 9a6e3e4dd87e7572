"""A vLLM server started by the runner (``VLLMBackend``), its LoRA adapters, and the
security policy on its command line: the runner's reserved flags, the flags that have a
spec field of their own (``FIELD_FLAGS``), and the only other flags ``extra_args`` may
carry (``ALLOWED_EXTRA_FLAGS``, checked by ``check_extra_args``). Also the GPUs one server
uses (tensor x pipeline x data parallel, ``parallel_size``), at most the run's
(``check_parallelism``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from runners.spec.backends.base import Api, LoRAAssignment, NamedBackend
from runners.spec.common import _SAFE_PATH, FieldError, Strict, _label, _safe, _without_defaults

if TYPE_CHECKING:
    from runners.spec.root import Spec


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


# VLLMBackend fields added after runs were stored, at their defaults: left out of
# server_config() (and so of stored fingerprints) until a spec sets them.
_ADDED_VLLM_DEFAULTS: dict[str, Any] = {
    "api": "completions",
    "lora_adapters": [],
    "max_lora_rank": None,
    "lora_assignment": "random",
    "image": None,
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
    image: str | None = Field(
        None,
        description=(
            "The image this server runs in, on Kubernetes with each server in a Pod of its "
            "own: another vLLM version or build to compare (a configuration search over "
            "image). Null: the run's runner image. A local run refuses it; a portal "
            "accepts the images its admin allows."
        ),
    )

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return None if v is None else _safe(v, "image")

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


def check_parallelism(spec: Spec) -> None:
    """A server may not use more GPUs than the run asks for (a CPU run: one)."""
    gpus = spec.resources.gpu_count
    for i, b in enumerate(spec.backends):
        if not isinstance(b, VLLMBackend) or b.gpus_per_server <= max(gpus, 1):
            continue
        field = "tensor_parallel_size" if b.tensor_parallel_size > max(gpus, 1) else "extra_args"
        raise FieldError(
            f"backends.{i}.{field}",
            f"backend {b.name!r} uses {b.gpus_per_server} GPUs (tensor x pipeline x data "
            f"parallel) but resources.gpu_count is {gpus}; raise resources.gpu_count or "
            "lower the parallelism",
        )
