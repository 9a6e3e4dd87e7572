"""Endpoint backends on Kubernetes, against a real kube-apiserver and Job controller.

A spec whose backends are all endpoints (deployed servers) starts no server, so its
runner Job asks for no GPU; an endpoint's API key comes from a Secret the admin allowed,
as the variable the runner reads (``EndpointBackend.key_env``), never as a literal.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from k8s_support import GPU_TYPE, gpu_spec
from kubernetes import client

from portal.benchmarks import intake
from portal.benchmarks.models import Run, RunStatus
from portal.dispatch import dispatcher, kubejob
from runners import spec as rs

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(300)]

IMAGE = "registry.example.com/servebench-runner:test"


@pytest.fixture
def k8s(settings: Any, control_plane: Any, namespace: str) -> Any:
    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    settings.SERVEBENCH_K8S_KUBECONFIG = str(control_plane.kubeconfig)
    settings.SERVEBENCH_K8S_NAMESPACE = namespace
    settings.SERVEBENCH_K8S_RUNNER_IMAGE = IMAGE
    settings.SERVEBENCH_K8S_API_ATTEMPTS = 2
    settings.SERVEBENCH_GPU_TYPES = [GPU_TYPE]
    settings.SERVEBENCH_ENDPOINT_HOSTS = ["*.svc.cluster.local", "api.example.com:443"]
    settings.SERVEBENCH_ENDPOINT_KEY_SECRETS = ["prod-vllm-key"]
    return settings


def endpoint_spec(**extra: Any) -> dict[str, Any]:
    return {
        "name": "production vs staging",
        "model": {"id": "Qwen/Qwen3-0.6B", "max_model_len": 4096},
        "workload": {"input_len": 256, "output_len": 64, "num_prompts": 32},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1, 8]}],
        "backends": [
            {
                "kind": "endpoint",
                "name": "prod",
                "base_url": "http://vllm.prod.svc.cluster.local:8000",
                "model": "qwen3",
                "api": "chat",
                "api_key": {"secret": "prod-vllm-key", "key": "token"},
            },
            {
                "kind": "endpoint",
                "name": "gateway",
                "base_url": "https://api.example.com",
                "request_fields": "openai",
            },
        ],
        **extra,
    }


def dispatched(make_run: Any, spec: dict[str, Any]) -> Run:
    run = make_run(spec=spec)
    assert dispatcher.dispatch_run(run.pk) == "submitted", Run.objects.get(pk=run.pk).failure_reason
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED
    return run


def test_a_spec_of_only_endpoints_creates_a_job_without_a_gpu(k8s, make_run, kube_api, kubelet):
    run = dispatched(make_run, endpoint_spec())
    assert run.spec["resources"]["gpu_count"] == 0  # written into the spec as executed
    handle = run.executor_handle
    job = client.BatchV1Api(kube_api).read_namespaced_job(handle["job"], handle["namespace"])
    manifest = kubejob.to_manifest(job)
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    limits = container["resources"]["limits"]
    assert not any("gpu" in name for name in limits), limits
    assert not any("gpu" in name for name in container["resources"]["requests"])
    # The real Job controller made the Pod from that template: no GPU there either.
    pod = kubelet.pod_of(handle["job"])
    assert not any("gpu" in name for name in (pod.spec.containers[0].resources.limits or {}))

    # The key: from the allowed Secret, under the name the runner reads, never a literal.
    backend = rs.parse_spec(run.spec).endpoint_backends[0]
    env = {e["name"]: e for e in container["env"]}
    assert env[backend.key_env()]["valueFrom"]["secretKeyRef"] == {
        "name": "prod-vllm-key",
        "key": "token",
        "optional": True,
    }
    assert "value" not in env[backend.key_env()]
    assert len([e for e in env if e.startswith("SERVEBENCH_ENDPOINT_KEY_")]) == 1


def test_a_spec_with_a_vllm_backend_beside_endpoints_keeps_its_gpu(k8s, make_run, kube_api):
    """The GPU goes to the vLLM server's own Pod (servers apart, the default); the runner,
    which only sends requests, asks for none."""
    spec = endpoint_spec()
    spec["backends"].append({"kind": "vllm"})
    spec["resources"] = {"gpu_count": 1}
    run = dispatched(make_run, spec)
    handle = run.executor_handle
    job = client.BatchV1Api(kube_api).read_namespaced_job(handle["job"], handle["namespace"])
    (container,) = kubejob.to_manifest(job)["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    (template,) = [e["value"] for e in container["env"] if e["name"] == kubejob.SERVER_POD_ENV]
    (server,) = json.loads(template)["spec"]["containers"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (
            lambda s: s["backends"][0].update(base_url="http://10.0.0.7:8000"),
            "spec.backends.0.base_url",
            "SERVEBENCH_ENDPOINT_HOSTS",
        ),
        (
            lambda s: s["backends"][1].update(base_url="http://api.example.com:8080"),
            "spec.backends.1.base_url",
            "port 8080",
        ),
        (
            lambda s: s["backends"][0].update(api_key={"secret": "servebench-run-abc"}),
            "spec.backends.0.api_key.secret",
            "SERVEBENCH_ENDPOINT_KEY_SECRETS",
        ),
        (
            lambda s: s["backends"][0].update(api_key={"env": "PROD_ENDPOINT_API_KEY"}),
            "spec.backends.0.api_key.env",
            "use api_key.secret",
        ),
        (
            lambda s: s.update(resources={"gpu_count": 2}),
            "spec.resources.gpu_count",
            "needs no GPU",
        ),
    ],
    ids=["host", "port", "other-secret", "env-on-kubernetes", "gpu-for-nothing"],
)
def test_what_an_endpoint_spec_may_not_ask_is_refused_naming_the_field(
    k8s, make_user, change, field, words
):
    spec = endpoint_spec()
    change(spec)
    with pytest.raises(rs.SpecError) as caught:
        intake.spec_from_request({"spec": json.loads(json.dumps(spec))}, make_user())
    first = caught.value.errors[0]
    assert first["field"] == field, caught.value.errors
    assert words in first["message"]


def test_the_gpu_spec_of_the_other_tests_still_asks_for_its_gpu(k8s, make_run, kube_api):
    run = dispatched(make_run, gpu_spec())
    handle = run.executor_handle
    job = client.BatchV1Api(kube_api).read_namespaced_job(handle["job"], handle["namespace"])
    (container,) = kubejob.to_manifest(job)["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
