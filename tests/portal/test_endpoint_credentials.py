"""Credential variables are never endpoint keys (runners.credentials), whatever an admin
lists in SERVEBENCH_ENDPOINT_KEY_ENVS: the settings refuse to load such a list, and the
portal refuses such a spec at submit, naming ``backends.<i>.api_key.env`` and why. (The
runner's own refusal at run time is in tests/runners/test_egress.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from portal.accounts.tokens import create_user_token
from portal.benchmarks.models import Run
from runners import credentials

REPO = Path(__file__).resolve().parents[2]

# Every credential the portal, the runner, the CLI or the storage reads, as a variable.
CREDENTIALS = [
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_HUB_TOKEN",
    "SECRET_KEY",
    "SECRET_KEY_FILE",
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "SERVEBENCH_RUN_TOKEN",
    "SERVEBENCH_TOKEN_KEY",
    "SERVEBENCH_TOKEN",
    "SERVEBENCH_PAGE_CACHE_URL",
    "SERVEBENCH_K8S_KUBECONFIG",
    "SERVEBENCH_DEMO_PASSWORD",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "KUBECONFIG",
    "hf_token",
]


@pytest.mark.parametrize("name", CREDENTIALS)
def test_each_credential_variable_is_named_with_what_it_is(name: str) -> None:
    assert credentials.reserved(name), name
    assert f"{name} is " in (credentials.refusal(name) or "")


@pytest.mark.parametrize(
    "name", ["PROD_VLLM_BEARER", "OPENAI_API_KEY", "SERVEBENCH_ENDPOINT_KEY_PROD_1A2B3C"]
)
def test_an_endpoints_own_variable_is_not_one(name: str) -> None:
    assert credentials.reserved(name) is None


@pytest.fixture
def api(make_user: Any, settings: Any) -> Any:
    from django.test import Client

    settings.SERVEBENCH_EXECUTOR = "local"
    settings.SERVEBENCH_ENDPOINT_HOSTS = ["*.svc.cluster.local"]
    owner = make_user("keys-owner")
    return Client(headers={"Authorization": f"Bearer {create_user_token(owner, 'k').plaintext}"})


def _spec(key_env: str) -> dict[str, Any]:
    endpoint = {
        "kind": "endpoint",
        "name": "prod",
        "base_url": "http://vllm.prod.svc.cluster.local:8000",
        "api_key": {"env": key_env},
    }
    return {
        "model": {"id": "org/tiny-model", "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 8, "num_warmups": 0},
        "backends": [{"kind": "vllm"}, endpoint],
        "resources": {"gpu_count": 0},
    }


@pytest.mark.django_db
@pytest.mark.parametrize("name", CREDENTIALS)
def test_a_spec_naming_a_credential_is_refused_even_when_the_admin_lists_it(
    api: Any, settings: Any, name: str
) -> None:
    # As if the settings had loaded with it (they refuse to: below).
    settings.SERVEBENCH_ENDPOINT_KEY_ENVS = [name, "PROD_VLLM_BEARER"]
    response = api.post("/api/v1/runs/", json.dumps({"spec": _spec(name)}), "application/json")
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["field"] == "spec.backends.1.api_key.env"
    assert f"{name} is " in error["message"] and "never sent to an endpoint" in error["message"]
    assert Run.objects.count() == 0
    accepted = api.post(
        "/api/v1/runs/", json.dumps({"spec": _spec("PROD_VLLM_BEARER")}), "application/json"
    )
    assert accepted.status_code == 201, accepted.content[:300]


@pytest.mark.parametrize("name", ["HF_TOKEN", "SERVEBENCH_RUN_TOKEN", "AWS_SECRET_ACCESS_KEY"])
def test_settings_naming_a_credential_as_a_key_variable_fail_at_load(name: str) -> None:
    environ = dict(os.environ, SERVEBENCH_ENDPOINT_KEY_ENVS=f"PROD_VLLM_BEARER,{name}")
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured: SERVEBENCH_ENDPOINT_KEY_ENVS names " + name in result.stderr
    assert "Remove it" in result.stderr
