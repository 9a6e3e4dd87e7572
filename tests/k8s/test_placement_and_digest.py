"""Admin placement wins over a spec's node selector, and the runner image's digest is the
one the node ran (its Pod's ``imageID``), recorded and shown."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from k8s_support import GPU_TYPE, gpu_spec, secret_value

from portal.benchmarks.models import Environment
from portal.dispatch import dispatcher, kubejob
from portal.dispatch.executors import get_executor

IMAGE = "registry.example.com/servebench-runner:0.1.0"
ADMIN = {"servebench.dev/pool": "gpu", "topology.kubernetes.io/zone": "zone-a"}


def _cfg(**kw: Any) -> kubejob.RunnerConfig:
    return kubejob.RunnerConfig(
        image=IMAGE,
        node_selector=dict(ADMIN),
        allowed_node_selector_keys=("topology.kubernetes.io/zone", "servebench.dev/disk"),
        **kw,
    )


@pytest.mark.parametrize(
    ("spec_selector", "expected"),
    [
        # A key the admin sets keeps the admin's value, whatever the spec says.
        ({"topology.kubernetes.io/zone": "zone-b"}, {}),
        # A key the admin does not allow never reaches the Pod.
        ({"servebench.dev/pool": "cpu", "kubernetes.io/hostname": "n1"}, {}),
        # An allowed key the admin leaves open is the spec's.
        ({"servebench.dev/disk": "nvme"}, {"servebench.dev/disk": "nvme"}),
        # The GPU type label is the spec's gpu_type, never its node_selector.
        ({"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090"}, {}),
    ],
)
def test_the_admins_placement_wins_over_the_specs(spec_selector, expected):
    resources = {"gpu_count": 1, "gpu_type": GPU_TYPE, "node_selector": spec_selector}
    selector = kubejob.node_selector(resources, _cfg())
    assert selector == {**expected, "nvidia.com/gpu.product": GPU_TYPE, **ADMIN}
    job = kubejob.build_job("abcdefghij0123456789", {"resources": resources}, "https://x/r", _cfg())
    assert kubejob.to_manifest(job)["spec"]["template"]["spec"]["nodeSelector"] == selector


@pytest.fixture
def on_k8s(settings: Any, control_plane: Any, namespace: str) -> Any:
    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    settings.SERVEBENCH_K8S_KUBECONFIG = str(control_plane.kubeconfig)
    settings.SERVEBENCH_K8S_NAMESPACE = namespace
    settings.SERVEBENCH_K8S_RUNNER_IMAGE = IMAGE
    settings.SERVEBENCH_GPU_TYPES = [GPU_TYPE]
    settings.SERVEBENCH_K8S_API_ATTEMPTS = 2
    return settings


def test_the_image_digest_is_the_pods_and_the_run_page_shows_it(
    on_k8s, make_run, kube_api, kubelet, namespace
):
    run = make_run(spec=gpu_spec())
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    run.refresh_from_db()
    executor = get_executor("kubernetes")
    assert executor.image_digest(run.executor_handle) == ""  # no Pod has started yet
    pod = kubelet.pod_of(run.executor_handle["job"])
    kubelet.running(pod)  # the kubelet's imageID: docker-pullable://repo@sha256:000...
    digest = "sha256:" + "0" * 64
    assert executor.image_digest(run.executor_handle) == digest

    # The runner reports its environment without a digest (it cannot see it); the portal
    # records the Pod's.
    token = secret_value(kube_api, namespace, run.executor_handle["job"], "run-token")
    runner = Client(headers={"Authorization": f"Bearer {token}"})
    environment = {"container": {"image": IMAGE, "image_digest": "none"}, "gpu": {"count": 1}}
    response = runner.post(
        f"/api/v1/runner/runs/{run.public_id}/events",
        {"type": "environment", "environment": environment, "fingerprint": "ab" * 32},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    snapshot = Environment.objects.get(run=run).snapshot
    assert snapshot["container"]["image_digest"] == digest
    page = Client()
    page.force_login(run.owner)
    html = page.get(run.get_absolute_url()).content.decode()
    assert digest in html  # the environment's "Image digest" and the reproduce section
    assert f"{IMAGE}@{digest}" in html  # the docker run command, pinned by digest


def test_a_digest_the_pod_did_not_have_yet_is_recorded_at_the_runs_end(
    on_k8s, make_run, kube_api, kubelet, namespace
):
    """The runner reports its environment as its container starts, often before the
    kubelet has written the Pod's ``imageID``; the run's end records it."""
    run = make_run(spec=gpu_spec())
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    run.refresh_from_db()
    token = secret_value(kube_api, namespace, run.executor_handle["job"], "run-token")
    runner = Client(headers={"Authorization": f"Bearer {token}"})
    url = f"/api/v1/runner/runs/{run.public_id}/events"
    environment = {"container": {"image": IMAGE, "image_digest": "none"}, "gpu": {"count": 1}}
    response = runner.post(
        url,
        {"type": "environment", "environment": environment, "fingerprint": "ab" * 32},
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    assert Environment.objects.get(run=run).snapshot["container"]["image_digest"] == "none"

    kubelet.running(kubelet.pod_of(run.executor_handle["job"]))
    response = runner.post(
        url, {"type": "failed", "message": "vLLM exited"}, content_type="application/json"
    )
    assert response.status_code == 200, response.content
    container = Environment.objects.get(run=run).snapshot["container"]
    assert container["image_digest"] == "sha256:" + "0" * 64
    assert container["image"] == IMAGE and container["image_digest_source"] == "kubernetes executor"


def test_reading_the_log_of_a_stuck_pod_changes_nothing(
    on_k8s, make_run, kube_api, kubelet, namespace
):
    """GET /api/v1/runs/{id}/logs says why a Pod cannot start, but only reconcile (the
    executor's ``status``) ends its Job: a GET never writes."""
    on_k8s.SERVEBENCH_K8S_START_GRACE_SECONDS = 0
    run = make_run(spec=gpu_spec())
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    run.refresh_from_db()
    name = run.executor_handle["job"]
    kubelet.waiting(kubelet.pod_of(name), "ImagePullBackOff", "Back-off pulling image")
    owner = Client()
    owner.force_login(run.owner)
    response = owner.get(f"/api/v1/runs/{run.public_id}/logs")
    assert response.status_code == 200
    assert response.json()["note"].startswith("image pull failed")
    job = kubelet.batch.read_namespaced_job(name, namespace)
    assert kubejob_failure(job) is None and job.spec.active_deadline_seconds == 600
    assert (
        get_executor("kubernetes")
        .status(run.executor_handle)
        .reason.startswith("image pull failed")
    )
    job = kubelet.batch.read_namespaced_job(name, namespace)
    assert kubejob_failure(job) is not None and job.spec.active_deadline_seconds == 1


def kubejob_failure(job: Any) -> str | None:
    from portal.dispatch.executors.kubernetes import FAILURE_ANNOTATION

    return (job.metadata.annotations or {}).get(FAILURE_ANNOTATION)
