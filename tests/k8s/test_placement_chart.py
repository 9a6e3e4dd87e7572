"""GPU cluster placement in the Helm chart and the settings, offline: the values
(``runner.kueue``, ``runner.priorityClassName``, ``runner.runtimeClassName``,
``runner.gpu.allowedResourceNames``, ``runner.shmSize*``) become settings the portal
accepts, and the Job it builds from them validates against Kubernetes 1.37's schemas;
the schema and the settings refuse bad values, naming them. (k8s/ equals the chart's
defaults: test_manifests.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from k8s_support import CHART, VALUES_EVERYTHING, index, render_chart, run_tool, validation_errors
from test_chart import run_with_settings
from test_k8s_settings import load_settings

PLACEMENT_KEYS = {
    "SERVEBENCH_K8S_SHM_SIZE",
    "SERVEBENCH_K8S_SHM_PER_GPU",
    "SERVEBENCH_K8S_SHM_MAX",
    "SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES",
    "SERVEBENCH_K8S_KUEUE_QUEUE",
    "SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES",
    "SERVEBENCH_K8S_KUEUE_USER_QUEUES",
    "SERVEBENCH_K8S_PRIORITY_CLASS",
    "SERVEBENCH_K8S_ALLOWED_PRIORITY_CLASSES",
    "SERVEBENCH_K8S_RUNTIME_CLASS",
}

# The settings and the Job of one run (4 GPUs, tensor parallel 4, choosing what it may)
# for a user, in a fresh process reading the rendered ConfigMap.
JOB_CODE = """
import json, django
django.setup()
from django.conf import settings
from portal.dispatch import kubejob
cfg = kubejob.RunnerConfig.from_settings()
resources = {"gpu_count": 4, "timeout_minutes": 30, **%(resources)r}
spec = {"model": {"id": "m"}, "resources": resources,
        "backends": [{"kind": "vllm", "tensor_parallel_size": 4}]}
job = kubejob.build_job("abcdefghij0123456789", spec, "https://x/r", cfg, owner=%(owner)r)
names = %(keys)r
print(json.dumps({"settings": {n: getattr(settings, n) for n in names},
                  "job": kubejob.to_manifest(job)}))
"""


def server_pod(job: dict[str, Any]) -> dict[str, Any]:
    """The vLLM server's own Pod, as the Job hands it to the runner (servers apart)."""
    (runner,) = job["spec"]["template"]["spec"]["containers"]
    (value,) = [e["value"] for e in runner["env"] if e["name"] == "SERVEBENCH_SERVER_POD"]
    return json.loads(value)


def settings_and_job(config: dict[str, str], owner: str = "", **resources: Any) -> dict[str, Any]:
    code = JOB_CODE % {"resources": resources, "owner": owner, "keys": sorted(PLACEMENT_KEYS)}
    return run_with_settings(config, code)


def test_the_placement_values_are_settings_the_portal_accepts(helm):
    objects = index(render_chart(helm, "-f", str(VALUES_EVERYTHING)))
    config = objects[("ConfigMap", "bench")]["data"]
    assert {k: config[k] for k in PLACEMENT_KEYS} == {
        "SERVEBENCH_K8S_SHM_SIZE": "32Gi",
        "SERVEBENCH_K8S_SHM_PER_GPU": "12Gi",
        "SERVEBENCH_K8S_SHM_MAX": "64Gi",
        "SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES": "nvidia.com/mig-1g.10gb,nvidia.com/mig-3g.40gb",
        "SERVEBENCH_K8S_KUEUE_QUEUE": "benchmarks",
        "SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES": "benchmarks-urgent",
        "SERVEBENCH_K8S_KUEUE_USER_QUEUES": "alice=team-a,ci-bot=team-ci",
        "SERVEBENCH_K8S_PRIORITY_CLASS": "benchmark-low",
        "SERVEBENCH_K8S_ALLOWED_PRIORITY_CLASSES": "benchmark-high",
        "SERVEBENCH_K8S_RUNTIME_CLASS": "nvidia",
    }
    # The migration hook carries the same settings (a pre-install hook runs first).
    migrate = objects[("Job", "bench-migrate")]["spec"]["template"]["spec"]["containers"][0]
    assert {e["name"]: e["value"] for e in migrate["env"]} == config

    chosen = {"queue": "benchmarks-urgent", "priority_class": "benchmark-high"}
    out = settings_and_job(config, "bob", gpu_resource="nvidia.com/mig-3g.40gb", **chosen)
    s = out["settings"]
    assert s["SERVEBENCH_K8S_KUEUE_USER_QUEUES"] == {"alice": "team-a", "ci-bot": "team-ci"}
    assert s["SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES"] == [
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-3g.40gb",
    ]
    job = out["job"]
    assert validation_errors([job]) == []
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "benchmarks-urgent"
    assert job["spec"]["suspend"] is True
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "benchmark-high"
    # The GPUs, their runtime and shared memory are the vLLM server's, in its own Pod.
    assert "runtimeClassName" not in pod
    server = server_pod(job)["spec"]
    assert server["priorityClassName"] == "benchmark-high"
    assert server["runtimeClassName"] == "nvidia"
    limits = server["containers"][0]["resources"]["limits"]
    assert limits == {"memory": "128Gi", "nvidia.com/mig-3g.40gb": "4"}
    (dshm,) = [v for v in server["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "48Gi"}  # 4 x 12Gi

    # alice's queue is pinned; a choice the values do not allow falls back to the defaults.
    job = settings_and_job(config, "alice", queue="benchmarks-urgent", priority_class="x")["job"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert job["spec"]["template"]["spec"]["priorityClassName"] == "benchmark-low"


def test_by_default_no_placement_setting_changes_the_job(helm):
    config = index(render_chart(helm))[("ConfigMap", "servebench")]["data"]
    assert {k: config[k] for k in PLACEMENT_KEYS} == dict.fromkeys(PLACEMENT_KEYS, "")
    job = settings_and_job(config)["job"]
    assert validation_errors([job]) == []
    assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"]
    assert "suspend" not in job["spec"]
    pod = job["spec"]["template"]["spec"]
    assert "priorityClassName" not in pod and "runtimeClassName" not in pod
    assert pod["containers"][0]["resources"]["limits"] == {"memory": "8Gi"}  # the client's
    server = server_pod(job)["spec"]
    assert "priorityClassName" not in server and "runtimeClassName" not in server
    limits = server["containers"][0]["resources"]["limits"]
    assert limits == {"memory": "32Gi", "nvidia.com/gpu": "4"}
    (dshm,) = [v for v in server["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"] == {"medium": "Memory"}


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("runner.kueue.queueName=Team_A", "at '/runner/kueue/queueName'"),
        ("runner.kueue.allowedQueueNames={a b}", "at '/runner/kueue/allowedQueueNames/0'"),
        ("runner.kueue.userQueueNames.alice=Team", "at '/runner/kueue/userQueueNames/alice'"),
        # Other queues without a default: every other run would bypass Kueue.
        ("runner.kueue.allowedQueueNames={fast}", "at '/runner/kueue': 'anyOf' failed"),
        ("runner.kueue.queues=x", "additional properties 'queues' not allowed"),
        ("runner.priorityClassName=High", "at '/runner/priorityClassName'"),
        (
            "runner.allowedPriorityClassNames={high_prio}",
            "at '/runner/allowedPriorityClassNames/0'",
        ),
        ("runner.runtimeClassName=NVIDIA", "at '/runner/runtimeClassName'"),
        ("runner.gpu.resourceName=gpu", "at '/runner/gpu/resourceName'"),
        (
            "runner.gpu.allowedResourceNames={mig-1g.10gb}",
            "at '/runner/gpu/allowedResourceNames/0'",
        ),
        ("runner.shmSizePerGpu=lots", "at '/runner/shmSizePerGpu'"),
        ("runner.shmSizeMax=8GB", "at '/runner/shmSizeMax'"),
    ],
)
def test_the_schema_rejects_bad_placement_values_naming_them(helm, value, complaint):
    result = run_tool([helm, "template", "x", str(CHART), "--set", value], check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


@pytest.mark.parametrize(
    ("variables", "complaint"),
    [
        (
            {"SERVEBENCH_K8S_KUEUE_QUEUE": "Team A"},
            "SERVEBENCH_K8S_KUEUE_QUEUE: 'Team A' is not a Kueue LocalQueue name",
        ),
        (
            {"SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES": "fast"},
            "SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES / SERVEBENCH_K8S_KUEUE_USER_QUEUES need "
            "SERVEBENCH_K8S_KUEUE_QUEUE",
        ),
        (
            {"SERVEBENCH_K8S_KUEUE_QUEUE": "q", "SERVEBENCH_K8S_KUEUE_USER_QUEUES": "alice"},
            "SERVEBENCH_K8S_KUEUE_USER_QUEUES: 'alice' is not USER=QUEUE",
        ),
        (
            {"SERVEBENCH_K8S_PRIORITY_CLASS": "High"},
            "SERVEBENCH_K8S_PRIORITY_CLASS: 'High' is not a PriorityClass name",
        ),
        (
            {"SERVEBENCH_K8S_RUNTIME_CLASS": "nvidia runtime"},
            "SERVEBENCH_K8S_RUNTIME_CLASS: 'nvidia runtime' is not a RuntimeClass name",
        ),
        (
            {"SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES": "nvidia.com/gpu,mig-1g.10gb"},
            "SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES: 'mig-1g.10gb' is not an extended resource",
        ),
        (
            {"SERVEBENCH_K8S_GPU_RESOURCE": "kubernetes.io/gpu"},
            "SERVEBENCH_K8S_GPU_RESOURCE: 'kubernetes.io/gpu' is not an extended resource",
        ),
        (
            {"SERVEBENCH_K8S_SHM_PER_GPU": "4 GB"},
            "SERVEBENCH_K8S_SHM_PER_GPU: '4 GB' is not a size",
        ),
        (
            {"SERVEBENCH_K8S_SHM_SIZE": "16Gi", "SERVEBENCH_K8S_SHM_MAX": "8Gi"},
            "SERVEBENCH_K8S_SHM_SIZE=16Gi is above SERVEBENCH_K8S_SHM_MAX=8Gi",
        ),
    ],
)
def test_a_bad_placement_setting_stops_the_portal_naming_it(variables, complaint):
    result = load_settings(**variables)
    assert result.returncode != 0
    assert complaint in result.stderr
