"""The chart's operations options, offline with ``helm template``: the portal's /metrics
(a token in the Secret, an optional prometheus-operator ServiceMonitor), a
PodDisruptionBudget and a HorizontalPodAutoscaler for the web. All off by default, so the
defaults (and k8s/, which equals them: test_manifests.py) are unchanged."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from k8s_support import CHART, index, render_chart, run_tool, validation_errors
from test_chart import run_with_settings

ALL_ON = [
    "--set", "metrics.enabled=true",
    "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "metrics.serviceMonitor.labels.release=kube-prometheus-stack",
    "--set", "web.podDisruptionBudget.enabled=true",
    "--set", "web.autoscaling.enabled=true",
    "--set", "web.autoscaling.maxReplicas=8",
    "--set", "web.autoscaling.targetMemoryUtilizationPercentage=80",
]  # fmt: skip
OURS = {
    ("ServiceMonitor", "servebench-web"),
    ("PodDisruptionBudget", "servebench-web"),
    ("HorizontalPodAutoscaler", "servebench-web"),
}


def secret_data(objects: dict[tuple[str, str], Any]) -> dict[str, str]:
    data = objects[("Secret", "servebench")]["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def test_by_default_none_of_them_and_no_metrics_token(helm):
    objects = index(render_chart(helm))
    assert not OURS & set(objects)
    assert "SERVEBENCH_METRICS_TOKEN" not in secret_data(objects)
    web = objects[("Deployment", "servebench-web")]
    assert web["spec"]["replicas"] == 2
    annotations = web["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/metrics" not in annotations


def test_everything_on_lints_and_renders_valid_objects(helm):
    result = run_tool([helm, "lint", "--strict", str(CHART), *ALL_ON])
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    docs = render_chart(helm, *ALL_ON)
    objects = index(docs)
    assert set(objects) >= OURS
    # ServiceMonitor is a CRD (no schema in kubernetes-validate): the rest is validated.
    assert validation_errors([d for d in docs if d["kind"] != "ServiceMonitor"]) == []

    web = objects[("Deployment", "servebench-web")]
    pod_labels = web["spec"]["template"]["metadata"]["labels"]
    pdb = objects[("PodDisruptionBudget", "servebench-web")]["spec"]
    assert pdb["minAvailable"] == 1 and "maxUnavailable" not in pdb
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()

    hpa = objects[("HorizontalPodAutoscaler", "servebench-web")]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "servebench-web",
    }
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 8)
    targets = {m["resource"]["name"]: m["resource"]["target"] for m in hpa["metrics"]}
    assert targets == {
        "cpu": {"type": "Utilization", "averageUtilization": 70},
        "memory": {"type": "Utilization", "averageUtilization": 80},
    }
    assert "replicas" not in web["spec"]  # the autoscaler owns it

    monitor = objects[("ServiceMonitor", "servebench-web")]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = objects[("Service", "servebench-web")]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["servebench"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["path"], endpoint["interval"]) == ("/metrics", "30s")
    assert endpoint["bearerTokenSecret"] == {
        "name": "servebench",
        "key": "SERVEBENCH_METRICS_TOKEN",
    }
    token = secret_data(objects)["SERVEBENCH_METRICS_TOKEN"]
    assert len(token) == 40  # generated at install (kept on upgrades: looked up)
    assert "checksum/metrics" in web["spec"]["template"]["metadata"]["annotations"]


def test_the_portal_takes_the_charts_token_and_guards_metrics_with_it(helm):
    objects = index(render_chart(helm, "--set", "metrics.enabled=true",
                                 "--set", "metrics.token=a-token-of-our-own-0123"))  # fmt: skip
    config = objects[("ConfigMap", "servebench")]["data"]
    token = secret_data(objects)["SERVEBENCH_METRICS_TOKEN"]
    assert token == "a-token-of-our-own-0123"
    code = (
        "import json, django; django.setup(); from django.test import RequestFactory; "
        "from portal.ops import metrics; f = RequestFactory(); "
        "print(json.dumps([metrics.enabled(), "
        "metrics.allowed(f.get('/metrics', HTTP_AUTHORIZATION='Bearer a-token-of-our-own-0123')), "
        "metrics.allowed(f.get('/metrics'))]))"
    )
    assert run_with_settings(config, code, SERVEBENCH_METRICS_TOKEN=token) == [True, True, False]


def test_a_max_unavailable_budget_and_bad_values_are_refused(helm):
    budget = ["--set", "web.podDisruptionBudget.enabled=true",
              "--set", "web.podDisruptionBudget.maxUnavailable=25%"]  # fmt: skip
    pdb = index(render_chart(helm, *budget))[("PodDisruptionBudget", "servebench-web")]["spec"]
    assert pdb["maxUnavailable"] == "25%" and "minAvailable" not in pdb
    for bad, message in (
        (["--set", "metrics.token=short"], "/metrics/token"),
        (["--set", "web.autoscaling.enabled=true", "--set", "web.autoscaling.minReplicas=9"],
         "minReplicas is above"),
        (["--set", "web.podDisruptionBudget.minAvailable=half"], "minAvailable"),
        (["--set", "metrics.serviceMonitor.interval=often"], "interval"),
    ):  # fmt: skip
        result = run_tool([helm, "template", "servebench", str(CHART), *bad], check=False)
        assert result.returncode != 0 and message in result.stderr, (bad, result.stderr)


@pytest.mark.parametrize("existing", [True, False])
def test_with_an_existing_secret_the_monitor_reads_its_key(helm, existing):
    args = [*ALL_ON, *(["--set", "existingSecret=my-credentials"] if existing else [])]
    objects = index(render_chart(helm, *args))
    endpoint = objects[("ServiceMonitor", "servebench-web")]["spec"]["endpoints"][0]
    name = "my-credentials" if existing else "servebench"
    assert endpoint["bearerTokenSecret"]["name"] == name
    assert (("Secret", "servebench") in objects) is not existing
