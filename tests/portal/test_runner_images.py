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
