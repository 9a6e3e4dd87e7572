"""The Helm chart, offline: lint, render, validate against Kubernetes 1.37's schemas, and
check the behaviour the chart promises (one beat, migrations hook, least privilege, roll
on settings change, runner defaults that the portal's settings really accept)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from k8s_support import (
    CHART,
    REPO,
    VALUES_EVERYTHING,
    index,
    render_chart,
    run_tool,
    validation_errors,
)

DEFAULT_KINDS = {
    ("ServiceAccount", "servebench"),
    ("Secret", "servebench"),
    ("ConfigMap", "servebench"),
    ("Role", "servebench-runner-jobs"),
    ("RoleBinding", "servebench-runner-jobs"),
    ("Service", "servebench-web"),
    ("Deployment", "servebench-web"),
    ("Deployment", "servebench-worker"),
    ("Deployment", "servebench-beat"),
    ("Secret", "servebench-migrations"),
    ("Job", "servebench-migrate"),
}


def container(doc: dict[str, Any]) -> dict[str, Any]:
    (only,) = doc["spec"]["template"]["spec"]["containers"]
    return only


@pytest.mark.parametrize(
    "values", [[], ["-f", str(VALUES_EVERYTHING)]], ids=["defaults", "everything"]
)
def test_the_chart_lints_strictly(helm, values):
    result = run_tool([helm, "lint", "--strict", str(CHART), *values])
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_the_defaults_render_valid_objects(helm):
    docs = render_chart(helm)
    assert set(index(docs)) == DEFAULT_KINDS
    assert validation_errors(docs) == []


def test_everything_on_renders_valid_objects(helm):
    docs = render_chart(helm, "-f", str(VALUES_EVERYTHING))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {
        ("ServiceAccount", "servebench-portal"),
        ("ConfigMap", "bench"),
        ("Role", "bench-runner-jobs"),
        ("RoleBinding", "bench-runner-jobs"),
        ("Service", "bench-web"),
        ("Ingress", "bench"),
        ("PersistentVolumeClaim", "bench-hf-cache"),
        ("Deployment", "bench-web"),
        ("Deployment", "bench-worker"),
        ("Deployment", "bench-beat"),
        ("Job", "bench-migrate"),
    }  # no Secret: existingSecret
    assert validation_errors(docs) == []
    objects = index(docs)
    ingress = objects[("Ingress", "bench")]["spec"]
    assert ingress["ingressClassName"] == "nginx"
    assert ingress["rules"][0]["host"] == "bench.example.com"
    assert ingress["tls"] == [{"secretName": "bench-tls", "hosts": ["bench.example.com"]}]
    # Role and PVC where the runner Jobs go; the binding names the portal's account.
    assert objects[("Role", "bench-runner-jobs")]["metadata"]["namespace"] == "servebench-runs"
    binding = objects[("RoleBinding", "bench-runner-jobs")]
    assert binding["metadata"]["namespace"] == "servebench-runs"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "servebench-portal", "namespace": "servebench"}
    ]
    pvc = objects[("PersistentVolumeClaim", "bench-hf-cache")]
    assert pvc["metadata"]["namespace"] == "servebench-runs"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "2Ti"
    for name in ("bench-web", "bench-worker", "bench-beat"):
        spec = objects[("Deployment", name)]["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
        assert {"secretRef": {"name": "servebench-credentials"}} in container(
            objects[("Deployment", name)]
        )["envFrom"]


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("web.replica=2", "additional properties 'replica' not allowed"),
        ("beat.replicas=2", "additional properties 'replicas' not allowed"),
        ("runner.resources.memory=lots", "'lots' does not match pattern"),
        ("publicUrl=bench.example.com", "does not match pattern"),
        ("secrets.databaseUrl=mysql://db/x", "does not match pattern"),
    ],
)
def test_the_schema_rejects_bad_values_naming_them(helm, value, complaint):
    result = run_tool([helm, "template", "x", str(CHART), "--set", value], check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


def test_beat_is_exactly_one_pod_replaced_not_rolled(helm):
    beat = index(render_chart(helm))[("Deployment", "servebench-beat")]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert container(beat)["command"][:4] == ["celery", "-A", "portal.celery", "beat"]
    assert beat["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_migrations_are_a_hook_with_the_portals_settings(helm):
    objects = index(render_chart(helm))
    job = objects[("Job", "servebench-migrate")]
    secret = objects[("Secret", "servebench-migrations")]
    hooks = job["metadata"]["annotations"]
    assert hooks["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        hooks["helm.sh/hook-weight"]
    )
    assert "hook-succeeded" in secret["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod  # the release's account does not exist yet
    migrate = container(job)
    assert migrate["command"] == ["python", "manage.py", "migrate", "--noinput"]
    # The same settings the ConfigMap gives the other pods, and a copy of the same secrets.
    env = {e["name"]: e["value"] for e in migrate["env"]}
    assert env == objects[("ConfigMap", "servebench")]["data"]
    assert migrate["envFrom"] == [{"secretRef": {"name": "servebench-migrations"}}]
    assert set(secret["data"]) == set(objects[("Secret", "servebench")]["data"])


def test_the_portal_role_is_least_privilege(helm):
    objects = index(render_chart(helm))
    rules = objects[("Role", "servebench-runner-jobs")]["rules"]
    assert rules == [
        {
            "apiGroups": ["batch"],
            "resources": ["jobs"],
            "verbs": ["create", "get", "list", "watch", "patch", "delete"],
        },
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "patch"]},
    ]
    for name, mounts_token in (("web", True), ("worker", True), ("beat", False)):
        pod = objects[("Deployment", f"servebench-{name}")]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "servebench"
        assert pod.get("automountServiceAccountToken", True) is mounts_token
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container(objects[("Deployment", f"servebench-{name}")])["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }


def test_a_settings_change_rolls_the_pods(helm):
    def checksums(*args: str) -> dict[str, str]:
        web = index(render_chart(helm, *args))[("Deployment", "servebench-web")]
        return web["spec"]["template"]["metadata"]["annotations"]

    base = checksums()
    assert checksums() == base  # stable: a re-render changes nothing
    config = checksums("--set", "publicUrl=https://bench.example.com")
    assert config["checksum/config"] != base["checksum/config"]
    assert config["checksum/secret"] == base["checksum/secret"]
    secret = checksums("--set", "secrets.databaseUrl=postgres://u:p@db/x")
    assert secret["checksum/secret"] != base["checksum/secret"]


def test_probes_ask_healthz_with_a_host_django_accepts(helm):
    objects = index(render_chart(helm))
    web = container(objects[("Deployment", "servebench-web")])
    allowed = objects[("ConfigMap", "servebench")]["data"]["ALLOWED_HOSTS"].split(",")
    for probe in ("startupProbe", "readinessProbe"):
        get = web[probe]["httpGet"]
        assert get["path"] == "/healthz"
        (host,) = [h["value"] for h in get["httpHeaders"] if h["name"] == "Host"]
        assert host in allowed
    assert "tcpSocket" in web["livenessProbe"]  # a database outage restarts nothing
    worker = container(objects[("Deployment", "servebench-worker")])
    assert "inspect ping" in " ".join(worker["livenessProbe"]["exec"]["command"])


def test_the_runner_values_are_settings_the_portal_accepts(helm, tmp_path):
    """The ConfigMap, read by portal/settings.py in a fresh process, and the Job the
    executor would build from it, validated like the chart's own objects."""
    objects = index(render_chart(helm, "-f", str(VALUES_EVERYTHING)))
    env = dict(os.environ)
    env.update(objects[("ConfigMap", "bench")]["data"])
    env.update(
        SECRET_KEY="s" * 50,
        DATABASE_URL="postgres://u:p@db.example.com:5432/servebench",
        REDIS_URL="redis://redis.example.com:6379/0",
        DJANGO_SETTINGS_MODULE="portal.settings",
    )
    code = """
import json, django
django.setup()
from django.conf import settings
from portal.dispatch import kubejob
cfg = kubejob.RunnerConfig.from_settings()
resources = {"gpu_count": 2, "gpu_type": "H100", "timeout_minutes": 30}
spec = {"model": {"id": "m"}, "resources": resources}
job = kubejob.build_job("abcdefghij0123456789", spec, "https://x/api/v1/runner/runs/a", cfg)
names = [n for n in dir(settings) if n.startswith("SERVEBENCH_K8S_")]
print(json.dumps({"settings": {n: getattr(settings, n) for n in names},
                  "job": kubejob.to_manifest(job)}))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    s = out["settings"]
    assert s["SERVEBENCH_K8S_NAMESPACE"] == "servebench-runs"
    assert (
        s["SERVEBENCH_K8S_RUNNER_IMAGE"]
        == "registry.example.com/servebench-runner:0.1.0-vllm0.32.0"
    )
    assert s["SERVEBENCH_K8S_IMAGE_PULL_SECRETS"] == ["registry-credentials", "other-registry"]
    assert s["SERVEBENCH_K8S_TOLERATIONS"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert s["SERVEBENCH_K8S_NODE_SELECTOR"] == {"pool": "gpu"}
    assert s["SERVEBENCH_K8S_HF_CACHE_PVC"] == "bench-hf-cache"
    assert s["SERVEBENCH_K8S_HF_HOME"] == "/models/hf"
    assert s["SERVEBENCH_K8S_MAX_GPUS"] == 8
    assert s["SERVEBENCH_K8S_REPORT_URL"] == "https://bench.example.com"
    assert s["SERVEBENCH_K8S_START_GRACE_SECONDS"] == 300
    job = out["job"]
    assert validation_errors([job]) == []
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu", "servebench.dev/gpu-type": "H100"}
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}, {"name": "other-registry"}]
    assert pod["serviceAccountName"] == "servebench-runner"
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits == {"memory": "128Gi", "nvidia.com/gpu": "2"}
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600
