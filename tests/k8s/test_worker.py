"""A real Celery worker with beat, configured for Kubernetes, against the real control plane.

The run is submitted through the REST API; the worker's dispatch task creates the Job; the
test plays the kubelet; beat's reconcile task fails the run with the executor's reason;
a cancel through the API makes the worker's stop task delete the Job.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from k8s_support import GPU_TYPE, gpu_spec, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

from portal.benchmarks.models import Run, RunStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

IMAGE = "registry.example.com/servebench-runner:worker-test"


def submit(persona: Any, spec: dict[str, Any]) -> Run:
    response = persona.client.post(
        "/api/v1/runs/", json.dumps({"spec": spec}), content_type="application/json"
    )
    assert response.status_code == 201, response.content
    return Run.objects.get(public_id=response.json()["id"])


def handle_of(run: Run) -> dict[str, Any]:
    def ready() -> Any:
        run.refresh_from_db()
        if run.status == RunStatus.FAILED:
            raise AssertionError(f"dispatch failed: {run.failure_reason}")
        # The claim stores the Job's name; the uid arrives once the Job exists.
        return run.executor_handle if "uid" in (run.executor_handle or {}) else None

    return wait_for(ready, 60, "the worker to submit the Job")


def test_a_worker_submits_jobs_and_beat_reconciles_them(
    celery_worker, personas, control_plane, namespace, kube_api, kubelet, settings
):
    deployment = {
        "SERVEBENCH_EXECUTOR": "kubernetes",
        "SERVEBENCH_K8S_KUBECONFIG": str(control_plane.kubeconfig),
        "SERVEBENCH_K8S_NAMESPACE": namespace,
        "SERVEBENCH_K8S_RUNNER_IMAGE": IMAGE,
    }
    worker = celery_worker(
        beat=True, reconcile_seconds=1, extra_env={**deployment, "SERVEBENCH_GPU_TYPES": GPU_TYPE}
    )
    for key, value in deployment.items():  # this process serves the API (logs)
        setattr(settings, key, value)
    settings.SERVEBENCH_GPU_TYPES = [GPU_TYPE]
    owner = personas["owner"]

    # 1. The runner exits 2 without reporting: beat's reconcile fails the run with the code.
    run = submit(owner, gpu_spec())
    handle = handle_of(run)
    assert (run.executor, handle["namespace"]) == ("kubernetes", namespace)
    pod = kubelet.pod_of(handle["job"])
    assert pod.spec.containers[0].image == IMAGE
    kubelet.running(pod)
    kubelet.terminated(pod, 2, message="invalid spec:\n  model.id: cannot be resolved")
    kubelet.job_condition(handle["job"])

    def failed() -> bool:
        run.refresh_from_db()
        return run.status == RunStatus.FAILED

    wait_for(failed, 90, f"beat's reconcile to fail the run\n{worker.output()[-3000:]}")
    assert run.failure_reason.startswith(
        f"runner exited with code 2 (usage error or invalid spec) in Pod {pod.metadata.name} "
        "without reporting a result; last lines of its log:\ninvalid spec:\n"
    )
    response = owner.client.get(f"/api/v1/runs/{run.public_id}/logs?tail=1")
    assert response.json()["lines"] == "  model.id: cannot be resolved"

    # 2. Cancel through the API: the worker's stop task deletes the Job (and its Pod).
    second = submit(owner, gpu_spec())
    job = handle_of(second)["job"]
    kubelet.running(kubelet.pod_of(job))
    response = owner.client.post(f"/api/v1/runs/{second.public_id}/cancel")
    assert response.status_code == 202, response.content
    batch, core = client.BatchV1Api(kube_api), client.CoreV1Api(kube_api)

    def job_gone() -> bool:
        try:
            batch.read_namespaced_job(job, namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(job_gone, 90, f"the stop task to delete the Job\n{worker.output()[-3000:]}")
    assert core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items == []
    second.refresh_from_db()
    assert second.status == RunStatus.CANCELLED
