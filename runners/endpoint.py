"""An OpenAI-compatible server that is already deployed: the ``endpoint`` backend's target.

The runner starts nothing for it. ``Endpoint`` gives the bench client (and the point
code shared with vLLM servers) what a ``VLLMServer`` gives: a base URL, whether it
answers, the log its failures quote; and it describes the target for the environment
document from what the target says about itself:

- ``GET /v1/models``: the served models (id, root, max_model_len, owned_by);
- ``GET /version`` (vLLM, SGLang's ``/get_server_info`` is not asked) and the ``Server``
  header of each answer;
- ``GET /metrics`` when it is exposed: which engine's metrics (``vllm:``, ``sglang:``,
  ``tgi_``) and, for vLLM, the KV cache it allocated;

everything else (its GPUs, driver, engine flags, the model revision) is ``unknown``:
the runner's own machine is not the endpoint's.

API keys: the spec names where a key is (``api_key.env``, or a Kubernetes Secret that the
Job maps to ``EndpointBackend.key_env()``), never the key. ``take_keys`` reads them once
and removes them from the runner's environment, so no child (a vLLM server, the HF
baseline, model code) inherits them; only the bench client of that endpoint's points gets
its key, as ``OPENAI_API_KEY`` (where vLLM's client reads it), never on a command line.
A variable that holds one of the portal's or the runner's own credentials (``HF_TOKEN``,
the run token...: ``runners.credentials``) is never read as a key, whatever the spec says;
the endpoint's points fail with that reason.

Requests go through ``runners.egress``: only to the endpoint's own origin, never
following a redirect (one is an error naming the status and where it pointed).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import requests

from runners import credentials
from runners.egress import Egress, EgressRefused
from runners.spec import EndpointBackend, Spec

UNKNOWN = "unknown"
PROBE_TIMEOUT_S = 10.0
_ENGINE_PREFIXES = (("vllm:", "vllm"), ("sglang:", "sglang"), ("tgi_", "tgi"))


class KeyMissing(RuntimeError):
    """The spec names an API key the runner's environment does not have."""


def read_keys(spec: Spec, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each endpoint's API key by backend name, from ``environ`` (default: os.environ).

    An endpoint whose variable is absent, or is one of the portal's or the runner's own
    credentials (``runners.credentials``: never read as a key), is left out; ``Endpoint``
    then fails its points with a reason (``missing_key_reason``).
    """
    env = os.environ if environ is None else environ
    keys = {}
    for name, backend in _key_variables(spec):
        if env.get(name):
            keys[backend.name] = env[name]
    return keys


def _key_variables(spec: Spec) -> list[tuple[str, EndpointBackend]]:
    """(variable, backend) for each endpoint whose key the runner may read."""
    return [
        (name, b)
        for b in spec.endpoint_backends
        if (name := b.key_env()) and credentials.reserved(name) is None
    ]


def take_keys(spec: Spec, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """``read_keys``, then remove those variables so no child process inherits them (a
    refused credential variable stays: it is the runner's, for its own use)."""
    env = os.environ if environ is None else environ
    keys = read_keys(spec, env)
    for name, _ in _key_variables(spec):
        env.pop(name, None)
    return keys


def missing_key_reason(backend: EndpointBackend) -> str:
    assert backend.api_key is not None
    name = backend.key_env()
    refusal = credentials.refusal(name) if name else None
    if refusal is not None:
        return f"endpoint {backend.name!r}: its api_key.env is refused: {refusal}"
    if backend.api_key.secret is not None:
        where = (
            f"the Kubernetes Secret {backend.api_key.secret!r} (key {backend.api_key.key!r}), "
            f"given to the runner as {backend.key_env()}"
        )
        fix = "create the Secret in the runner's namespace"
    else:
        where = f"the environment variable {backend.api_key.env}"
        fix = f"set {backend.api_key.env} where the runner starts"
    return f"endpoint {backend.name!r}: its API key ({where}) is not set in the runner; {fix}"


def served_model(spec: Spec, backend: EndpointBackend) -> str:
    return backend.model or spec.model.id


def _redact(text: str, key: str | None) -> str:
    return text.replace(key, "[api key]") if key else text


class Endpoint:
    """The target of an endpoint backend's points (the counterpart of ``VLLMServer``)."""

    def __init__(
        self, spec: Spec, backend: EndpointBackend, key: str | None, log_path: Path | None
    ) -> None:
        self.spec = spec
        self.backend = backend
        self.key = key
        self.log_path = log_path
        self.base_url = backend.base_url
        self.last_error = ""
        label = f"endpoint {backend.name!r} ({backend.base_url})"
        self.session = Egress.for_spec(spec).pinned(backend.base_url, label).session()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    @property
    def key_missing(self) -> bool:
        return self.backend.api_key is not None and not self.key

    def _log(self, line: str) -> None:
        if self.log_path is None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(_redact(line, self.key).rstrip() + "\n")

    def get(self, path: str, timeout: float = PROBE_TIMEOUT_S) -> requests.Response:
        return self.session.get(f"{self.base_url}{path}", headers=self.headers, timeout=timeout)

    @property
    def alive(self) -> bool:
        """Whether it answers now: ``GET /v1/models`` with 200, or (a server whose model
        list fails, e.g. ``transformers serve`` without a hub cache) ``GET /health`` with
        200, but never past a refused key. The reason is kept."""
        try:
            response = self.get("/v1/models")
            if response.status_code >= 404 and self.get("/health").status_code == 200:
                return True
        except EgressRefused as exc:
            self.last_error = str(exc)
            self._log(self.last_error)
            return False
        except requests.RequestException as exc:
            self.last_error = f"GET {self.base_url}/v1/models failed: {type(exc).__name__}: {exc}"
            self._log(self.last_error)
            return False
        if response.status_code != 200:
            hint = (
                " (the API key was refused: check api_key)"
                if response.status_code in (401, 403)
                else ""
            )
            self.last_error = (
                f"GET {self.base_url}/v1/models answered {response.status_code}{hint}: "
                f"{_redact(response.text[:300], self.key)}"
            )
            self._log(self.last_error)
            return False
        return True

    def unreachable_reason(self) -> str:
        return (
            f"endpoint {self.backend.name!r} did not answer: {self.last_error or 'unknown'}; "
            "check base_url, that the runner can reach it, and api_key"
        )

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def command(self) -> str:
        """No server is started for an endpoint: nothing to reproduce but the client."""
        return ""

    # ------------------------------------------------------------------ facts

    def describe(self) -> dict[str, Any]:
        """What the endpoint says about itself (module doc); never raises."""
        out: dict[str, Any] = {
            "kind": "endpoint",
            "base_url": self.base_url,
            "host": self.backend.host,
            "served_model": served_model(self.spec, self.backend),
            "api": self.backend.api,
            "request_fields": self.backend.request_fields,
            "api_key": "set" if self.key else ("missing" if self.key_missing else "none"),
            "engine": UNKNOWN,
            "version": UNKNOWN,
            "server_header": UNKNOWN,
            "models": UNKNOWN,
            "metrics_exposed": UNKNOWN,
            # What the runner cannot see from outside:
            "gpu": UNKNOWN,
            "engine_args": UNKNOWN,
            "model_revision": UNKNOWN,
        }
        guesses: list[str] = []
        models = self._json("/v1/models", out)
        if isinstance(models, dict) and isinstance(models.get("data"), list):
            out["models"] = [
                {k: m.get(k) for k in ("id", "root", "parent", "max_model_len", "owned_by")}
                for m in models["data"][:32]
                if isinstance(m, dict)
            ]
            guesses += [str(m.get("owned_by") or "") for m in out["models"]]
        version = self._json("/version", out)
        if isinstance(version, dict) and isinstance(version.get("version"), str):
            out["version"] = version["version"][:64]
        out["metrics_exposed"] = False
        try:
            response = self.get("/metrics")
            if response.status_code == 200 and "# TYPE" in response.text:
                out["metrics_exposed"] = True
                text = response.text
                found = [
                    e for prefix, e in _ENGINE_PREFIXES if re.search(rf"^{prefix}", text, re.M)
                ]
                out["metrics_engine"] = found[0] if found else UNKNOWN
                guesses += found
                if found[:1] == ["vllm"]:
                    from runners.server_metrics import cache_config

                    out["kv_cache"] = cache_config(text) or UNKNOWN
        except EgressRefused as exc:
            out.setdefault("errors", []).append(f"GET /metrics: {exc}")
        except requests.RequestException:
            pass
        engine = next((g for g in guesses if g in ("vllm", "sglang", "tgi")), None)
        out["engine"] = engine or UNKNOWN
        return out

    def _json(self, path: str, out: dict[str, Any]) -> Any:
        try:
            response = self.get(path)
        except EgressRefused as exc:
            out.setdefault("errors", []).append(f"GET {path}: {exc}")
            return None
        except requests.RequestException as exc:
            out.setdefault("errors", []).append(f"GET {path}: {type(exc).__name__}")
            return None
        server = response.headers.get("server")
        if server and out["server_header"] == UNKNOWN:
            out["server_header"] = server[:120]
        if response.status_code != 200:
            out.setdefault("errors", []).append(f"GET {path}: {response.status_code}")
            return None
        try:
            return response.json()
        except ValueError:
            return None


def describe_all(spec: Spec, keys: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``{backend name: Endpoint.describe()}`` for the environment document."""
    return {
        b.name: Endpoint(spec, b, keys.get(b.name), None).describe() for b in spec.endpoint_backends
    }
