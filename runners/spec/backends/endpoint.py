"""An OpenAI-compatible server that is already deployed (``EndpointBackend``): the rules
for its URL (no credentials, no /v1) and for where its key is found (``APIKey``: a
variable or a Kubernetes Secret, never the key), and what endpoints ask of the rest of the
spec (no GPU when every backend is one)."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from runners.spec.backends.base import Api, LoRAAssignment, NamedBackend
from runners.spec.common import _LABEL, _SAFE_PATH, FieldError, Strict, _safe

if TYPE_CHECKING:
    from runners.spec.root import Spec


# \A...\Z, never ^...$: '$' also matches before a trailing newline ("http://h:8000\n").
_ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
_SECRET_NAME = re.compile(r"\A[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?\Z")
_SECRET_KEY = re.compile(r"\A[-._A-Za-z0-9]{1,253}\Z")
_URL = re.compile(
    r"\A(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.\-]*[A-Za-z0-9])?)"
    r"(?::(?P<port>[0-9]{1,5}))?(?P<path>(?:/[A-Za-z0-9._~\-]+)*)/?\Z"
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
        if not _SECRET_KEY.match(v):
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


def check_endpoints(spec: Spec) -> None:
    """Endpoints get what they can take; a spec of only endpoints needs no GPU (left out,
    gpu_count 0 is written into the spec as executed)."""
    w = spec.workload
    for b in spec.backends:
        if isinstance(b, EndpointBackend) and b.request_fields == "openai" and w.top_k:
            raise FieldError(
                "workload.top_k",
                f"endpoint {b.name!r} takes only OpenAI fields (request_fields: openai), "
                "and top_k is not one; leave top_k out or set request_fields: vllm",
            )
    if not spec.backends or any(not isinstance(b, EndpointBackend) for b in spec.backends):
        return
    if "gpu_count" not in spec.resources.model_fields_set:
        # Written into the spec as executed: the runner Job asks for no GPU.
        spec.resources = spec.resources.model_copy(update={"gpu_count": 0})
    elif spec.resources.gpu_count > 0:
        raise FieldError(
            "resources.gpu_count",
            "every backend is an endpoint: the runner starts no server and needs no GPU; "
            "set gpu_count to 0 or leave it out",
        )
