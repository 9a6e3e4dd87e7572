"""The Kubernetes executor's settings fail at start-up, naming the variable, when wrong."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from k8s_support import REPO


def load_settings(**extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **extra}
    code = "import django; django.setup(); from django.conf import settings; print('ok')"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("variable", "value", "complaint"),
    [
        (
            "SERVEBENCH_K8S_TOLERATIONS",
            '{"key": "nvidia.com/gpu"}',
            "SERVEBENCH_K8S_TOLERATIONS must be a JSON list, not dict",
        ),
        (
            "SERVEBENCH_K8S_NODE_SELECTOR",
            "{pool: gpu}",
            "SERVEBENCH_K8S_NODE_SELECTOR is not valid JSON (Expecting property name",
        ),
        (
            "SERVEBENCH_K8S_IMAGE_PULL_POLICY",
            "Sometimes",
            "SERVEBENCH_K8S_IMAGE_PULL_POLICY='Sometimes' is not one of",
        ),
        ("SERVEBENCH_K8S_REPORT_URL", "bench.example.com", "SERVEBENCH_K8S_REPORT_URL="),
        ("SERVEBENCH_K8S_MAX_GPUS", "-1", "SERVEBENCH_K8S_MAX_GPUS=-1 is below the minimum 0"),
    ],
)
def test_a_bad_value_stops_the_portal_naming_it(variable, value, complaint):
    result = load_settings(**{variable: value})
    assert result.returncode != 0
    assert complaint in result.stderr


def test_json_settings_are_parsed():
    result = load_settings(
        SERVEBENCH_K8S_AFFINITY='{"nodeAffinity": {}}', SERVEBENCH_K8S_TOLERATIONS="[]"
    )
    assert result.returncode == 0, result.stderr
