"""The runner never reads one of its own credentials as an endpoint's API key
(runners.credentials), whatever the spec names: defence in depth behind the portal's
policy, for a spec that reached the runner another way (``python -m runners run``)."""

from __future__ import annotations

from typing import Any

import pytest

from runners.endpoint import missing_key_reason, read_keys, take_keys
from runners.spec import parse_spec

BASE_URL = "http://vllm.prod.svc.cluster.local:8000"


def endpoint_spec(**api_key: str) -> Any:
    backend = {"kind": "endpoint", "name": "prod", "base_url": BASE_URL, "api_key": api_key}
    return parse_spec({"model": {"id": "org/tiny-model"}, "backends": [backend]})


@pytest.mark.parametrize(
    "variable",
    ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "SERVEBENCH_RUN_TOKEN", "AWS_SECRET_ACCESS_KEY",
     "DATABASE_URL", "SECRET_KEY_FILE", "KUBECONFIG"],
)  # fmt: skip
def test_the_runner_never_reads_its_own_credentials_as_an_endpoint_key(variable: str) -> None:
    spec = endpoint_spec(env=variable)
    environ = {variable: "hf_the_runners_own_secret"}
    assert read_keys(spec, environ) == {}
    assert take_keys(spec, environ) == {}
    assert environ == {variable: "hf_the_runners_own_secret"}  # left for its own use
    reason = missing_key_reason(spec.backends[0])
    assert f"{variable} is " in reason and "never sent to an endpoint" in reason


def test_an_endpoint_key_variable_is_read_and_taken() -> None:
    spec = endpoint_spec(env="PROD_ENDPOINT_API_KEY")
    environ = {"PROD_ENDPOINT_API_KEY": "sk-1", "HF_TOKEN": "hf_x"}
    assert take_keys(spec, environ) == {"prod": "sk-1"}
    assert environ == {"HF_TOKEN": "hf_x"}
    secret = endpoint_spec(secret="prod-key")
    name = secret.backends[0].key_env()
    assert name is not None and name.startswith("SERVEBENCH_ENDPOINT_KEY_")
    assert read_keys(secret, {name: "sk-2"}) == {"prod": "sk-2"}
