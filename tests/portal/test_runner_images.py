"""A spec may only name runner images the deployment allows (they get the HF token)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from portal.benchmarks.models import Run

pytestmark = pytest.mark.django_db


def post(persona: Any, spec: dict[str, Any]) -> Any:
    return persona.client.post(
        "/api/v1/runs/", json.dumps({"spec": spec}), content_type="application/json"
    )


def test_an_image_nobody_allowed_is_refused_naming_the_field(personas, spec_dict, settings):
    settings.SERVEBENCH_K8S_RUNNER_IMAGE = "registry.example.com/servebench-runner:0.1.0"
    response = post(personas["owner"], spec_dict(resources={"image": "evil.example.com/x:1"}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["field"] == "spec.resources.image"
    assert "SERVEBENCH_ALLOWED_RUNNER_IMAGES" in error["message"]
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    "image",
    ["registry.example.com/servebench-runner:0.1.0", "registry.example.com/servebench-runner:0.2"],
)
def test_the_default_image_and_listed_ones_are_accepted(personas, spec_dict, settings, image):
    settings.SERVEBENCH_K8S_RUNNER_IMAGE = "registry.example.com/servebench-runner:0.1.0"
    settings.SERVEBENCH_ALLOWED_RUNNER_IMAGES = ["registry.example.com/servebench-runner:*"]
    # resources replaced whole: keep the CPU-only run this machine can execute.
    response = post(personas["owner"], spec_dict(resources={"image": image, "gpu_count": 0}))
    assert response.status_code == 201, response.json()
    assert Run.objects.get().spec["resources"]["image"] == image


def test_a_spec_without_an_image_uses_the_default(personas, spec_dict, settings):
    settings.SERVEBENCH_ALLOWED_RUNNER_IMAGES = []
    assert post(personas["owner"], spec_dict()).status_code == 201


def _image_spec(spec_dict: Any, image: str, *kinds: str) -> dict[str, Any]:
    spec = spec_dict(resources={"gpu_count": 0})
    spec["backends"] = [{"kind": k} for k in kinds] + [{"kind": "vllm", "image": image}]
    return spec


def test_a_servers_own_image_needs_kubernetes_with_servers_apart_and_the_allow_list(
    personas, spec_dict, settings
):
    """A vLLM server's own image (another vLLM version): allowed images only, and only
    where the server runs in a Pod of its own; each refusal names backends.N.image."""
    settings.SERVEBENCH_K8S_RUNNER_IMAGE = "registry.example.com/servebench-runner:0.1.0"
    settings.SERVEBENCH_ALLOWED_RUNNER_IMAGES = ["registry.example.com/servebench-runner:*"]
    newer = "registry.example.com/servebench-runner:vllm-0.33"
    owner = personas["owner"]

    settings.SERVEBENCH_EXECUTOR = "local"
    error = post(owner, _image_spec(spec_dict, newer)).json()["error"]
    assert error["field"] == "spec.backends.0.image"
    assert "SERVEBENCH_EXECUTOR=local" in error["message"] and "remove image" in error["message"]

    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    settings.SERVEBENCH_K8S_SERVER_PLACEMENT = "separate"
    error = post(owner, _image_spec(spec_dict, "evil.example.com/vllm:1")).json()["error"]
    assert error["field"] == "spec.backends.0.image"
    assert "is not allowed on this portal" in error["message"]
    # An HF baseline keeps the servers in the runner's Pod: no image of their own there.
    error = post(owner, _image_spec(spec_dict, newer, "hf-sequential")).json()["error"]
    assert error["field"] == "spec.backends.1.image"
    assert "hf-sequential runs inside the runner" in error["message"]
    assert Run.objects.count() == 0

    response = post(owner, _image_spec(spec_dict, newer))
    assert response.status_code == 201, response.json()
    assert Run.objects.get().spec["backends"][0]["image"] == newer
