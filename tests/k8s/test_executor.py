"""The Kubernetes executor against a real kube-apiserver and Job controller.

Runs go through the real ``dispatch_run`` and ``reconcile`` (portal.dispatch.dispatcher)
with ``SERVEBENCH_EXECUTOR=kubernetes``. The test plays the kubelet (``Kubelet`` in
conftest.py) by patching the Pod's status; the real Job controller then marks the Job
Complete or Failed, and the real garbage collector removes what a deleted Job owned.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from k8s_support import GPU_TYPE, free_port, gpu_spec, secret_value, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException

from portal.benchmarks import lifecycle
from portal.benchmarks.models import Run, RunStatus
from portal.dispatch import dispatcher, kubejob
from portal.dispatch.executors import ExecutorState, ExecutorUnavailable, get_executor

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(300)]

IMAGE = "registry.example.com/servebench-runner:test"
GPU_FULL = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."


@pytest.fixture
def k8s(settings: Any, control_plane: Any, namespace: str) -> Any:
    """Settings of a deployment using the Kubernetes executor on the test control plane."""
    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    settings.SERVEBENCH_K8S_KUBECONFIG = str(control_plane.kubeconfig)
    settings.SERVEBENCH_K8S_NAMESPACE = namespace
    settings.SERVEBENCH_K8S_RUNNER_IMAGE = IMAGE
    settings.SERVEBENCH_K8S_NODE_SELECTOR = {"servebench.dev/pool": "gpu"}
    settings.SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS = ["zone", "servebench.dev/zone"]
    settings.SERVEBENCH_GPU_TYPES = [GPU_TYPE, "NVIDIA-A100-SXM4-80GB"]
    settings.SERVEBENCH_K8S_TOLERATIONS = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    settings.SERVEBENCH_K8S_AFFINITY = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["true"]}]}
                ]
            }
        }
    }
    settings.SERVEBENCH_K8S_HF_CACHE_PVC = "hf-cache"
    settings.SERVEBENCH_K8S_HF_TOKEN_SECRET = "hf-token"
    settings.SERVEBENCH_K8S_SHM_SIZE = "8Gi"
    settings.SERVEBENCH_K8S_TTL_SECONDS = 3600
    settings.SERVEBENCH_K8S_API_ATTEMPTS = 2
    return settings


def dispatched(make_run: Any, **kwargs: Any) -> Run:
    run = make_run(spec=kwargs.pop("spec", None) or gpu_spec(), **kwargs)
    assert dispatcher.dispatch_run(run.pk) == "submitted", Run.objects.get(pk=run.pk).failure_reason
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED and run.executor == "kubernetes"
    return run


def started(kube_api: Any, run: Run) -> None:
    """Wait until the Job controller has started the run's Job (``status.startTime``).
    Kubernetes 1.20's controller misses a deadline lowered before it first synced the
    Job: the update it sees has no start time, and its own first sync queued the check
    after the old deadline (a CI run: a Job stopped 35 ms after its creation was still
    running 90 s later). A real kubelet takes seconds to report a Pod's state; this
    test's stand-in reports it at once."""
    wait_for(lambda: job_of(kube_api, run).status.start_time, 30, "the Job to be started")


def job_of(kube_api: Any, run: Run) -> Any:
    handle = run.executor_handle
    return client.BatchV1Api(kube_api).read_namespaced_job(handle["job"], handle["namespace"])


def status_of(run: Run) -> Any:
    return get_executor("kubernetes").status(run.executor_handle)


def reconciled(run: Run) -> Run:
    dispatcher.reconcile()
    run.refresh_from_db()
    return run


def post_event(token: str, run: Run, body: dict[str, Any]) -> Any:
    return Client(headers={"Authorization": f"Bearer {token}"}).post(
        f"/api/v1/runner/runs/{run.public_id}/events",
        json.dumps(body),
        content_type="application/json",
    )


def post_all_measurements(token: str, run: Run) -> None:
    """What a runner posts before ``finished: succeeded``: every measurement of its spec."""
    from runners import spec as rs
    from runners.vllm_bench import point_info

    spec = rs.parse_spec(run.spec)
    items = [(b.name, b.kind, rs.hf_point(spec, b)) for b in spec.hf_backends]
    items += [(b.name, b.kind, p) for b in spec.vllm_backends for p in spec.points()]
    runner = Client(headers={"Authorization": f"Bearer {token}"})
    for repeat in range(spec.repeats):
        for name, kind, point in items:
            body = {
                "backend": name,
                "backend_kind": kind,
                "point": point_info(point).model_dump(mode="json"),
                "repeat": repeat,
                "status": "succeeded",
                "metrics": {"output_throughput": 100.0, "completed": point.num_prompts},
                "started_at": "2026-11-30T06:00:00.000+00:00",
                "finished_at": "2026-11-30T06:00:05.000+00:00",
                "duration_s": 5.0,
            }
            response = runner.post(
                f"/api/v1/runner/runs/{run.public_id}/measurements",
                json.dumps(body),
                content_type="application/json",
            )
            assert response.status_code == 201, response.content


# --------------------------------------------------------------------------- submit


def test_dispatch_creates_a_job_that_the_api_server_accepts(k8s, make_run, kube_api, kubelet):
    run = dispatched(make_run, spec=gpu_spec(memory="48Gi", node_selector={"zone": "a"}))
    handle = run.executor_handle
    assert handle["job"] == f"servebench-run-{run.public_id}"
    job = job_of(kube_api, run)
    assert handle["uid"] == job.metadata.uid
    manifest = kubejob.to_manifest(job)
    labels = manifest["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "servebench"
    assert labels["app.kubernetes.io/component"] == "runner"
    assert labels["app.kubernetes.io/managed-by"] == "servebench-portal"
    assert labels["servebench.dev/run"] == run.public_id
    spec = manifest["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == 600
    assert spec["ttlSecondsAfterFinished"] == 3600  # kept: the feature gate is on
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert pod["shareProcessNamespace"] is True  # the pause container reaps vLLM's zombies
    assert pod["nodeSelector"] == {
        "servebench.dev/pool": "gpu",
        "zone": "a",
        "nvidia.com/gpu.product": GPU_TYPE,
    }
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    assert container["command"] == [
        "python", "-m", "runners", "run", "/spec/spec.json",
        "--report", f"http://testserver/api/v1/runner/runs/{run.public_id}",
        "--out", "/work/result.json", "--workdir", "/work/run",
    ]  # fmt: skip
    assert container["resources"] == {
        "limits": {"memory": "48Gi", "nvidia.com/gpu": "1"},
        "requests": {"cpu": "4", "memory": "48Gi"},
    }
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    env = {e["name"]: e for e in container["env"]}
    assert env["SERVEBENCH_RUN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": handle["job"],
        "key": "run-token",
    }
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "hf-token",
        "key": "token",
        "optional": True,
    }
    assert env["SERVEBENCH_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["SERVEBENCH_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["SERVEBENCH_POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    assert env["SERVEBENCH_IMAGE"]["value"] == IMAGE
    assert env["HF_HOME"]["value"] == "/root/.cache/huggingface"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert volumes["hf-cache"]["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    assert volumes["spec"]["secret"]["secretName"] == handle["job"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {
        "spec": "/spec",
        "work": "/work",
        "dshm": "/dev/shm",
        "hf-cache": "/root/.cache/huggingface",
    }

    # The Secret: owned by the Job, holding the spec and a token that really works.
    secret = client.CoreV1Api(kube_api).read_namespaced_secret(handle["job"], handle["namespace"])
    (owner,) = secret.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid) == ("Job", handle["job"], job.metadata.uid)
    spec_json = json.loads(secret_value(kube_api, handle["namespace"], handle["job"], "spec.json"))
    assert spec_json["resources"]["gpu_type"] == GPU_TYPE
    token = secret_value(kube_api, handle["namespace"], handle["job"], "run-token")
    assert token.startswith("sb_run_")
    assert token not in json.dumps(manifest)  # never in args or a literal env value
    response = post_event(token, run, {"type": "started", "total": 3})
    assert response.status_code == 200, response.content
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING

    # The real Job controller made the Pod from our template.
    pod_obj = kubelet.pod_of(handle["job"])
    assert pod_obj.metadata.labels["servebench.dev/run"] == run.public_id
    assert pod_obj.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert status_of(run).state == ExecutorState.PENDING


def test_a_duplicate_dispatch_does_not_create_a_second_job(k8s, make_run, kube_api, namespace):
    run = dispatched(make_run)
    assert dispatcher.dispatch_run(run.pk) == "not-queued"
    # A retried submit (the first answer was lost): the same Job, adopted; its Secret gets
    # the new token because the earlier attempt's was revoked.
    again = get_executor("kubernetes").submit(run, "sb_run_second-attempt")
    assert again == {k: v for k, v in run.executor_handle.items() if k != "attempts"}
    jobs = client.BatchV1Api(kube_api).list_namespaced_job(
        namespace, label_selector=f"servebench.dev/run={run.public_id}"
    )
    assert len(jobs.items) == 1
    assert secret_value(kube_api, namespace, again["job"], "run-token") == "sb_run_second-attempt"


# --------------------------------------------------------------------------- the lifecycle


def test_a_run_moves_with_its_pod_and_succeeds(k8s, make_run, kube_api, kubelet):
    run = dispatched(make_run)
    name = run.executor_handle["job"]
    pod = kubelet.pod_of(name)
    kubelet.running(pod)
    assert status_of(run).state == ExecutorState.RUNNING
    token = secret_value(kube_api, run.executor_handle["namespace"], name, "run-token")
    assert post_event(token, run, {"type": "started", "total": 0}).status_code == 200
    assert reconciled(run).status == RunStatus.RUNNING  # running: reconcile leaves it
    kubelet.terminated(pod, 0, reason="Completed")
    assert kubelet.job_condition(name).type == "Complete"
    assert status_of(run).state == ExecutorState.SUCCEEDED
    post_all_measurements(token, run)
    assert post_event(token, run, {"type": "finished", "status": "succeeded"}).status_code == 200
    assert reconciled(run).status == RunStatus.SUCCEEDED


def test_a_finished_job_is_deleted_after_its_ttl_with_what_it_owned(
    k8s, make_run, kube_api, kubelet
):
    k8s.SERVEBENCH_K8S_TTL_SECONDS = 0
    run = dispatched(make_run)
    ns, name = run.executor_handle["namespace"], run.executor_handle["job"]
    pod = kubelet.pod_of(name)
    kubelet.terminated(pod, 0, reason="Completed")
    batch, core = client.BatchV1Api(kube_api), client.CoreV1Api(kube_api)

    def gone() -> bool:
        try:
            batch.read_namespaced_job(name, ns)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, 90, "the TTL controller to delete the finished Job")
    wait_for(
        lambda: (
            not core.list_namespaced_secret(
                ns, label_selector=f"servebench.dev/run={run.public_id}"
            ).items
        ),
        90,
        "the garbage collector to delete the Job's Secret",
    )
    assert status_of(run).state == ExecutorState.GONE


def test_a_non_zero_exit_fails_the_run_with_the_code_and_the_log_tail(k8s, make_run, kubelet):
    run = dispatched(make_run)
    name = run.executor_handle["job"]
    pod = kubelet.pod_of(name)
    kubelet.running(pod)
    message = (
        "loading model\nTraceback (most recent call last):\n"
        "RuntimeError: CUDA error: illegal memory access"
    )
    kubelet.terminated(pod, 1, message=message)
    assert kubelet.job_condition(name).reason == "BackoffLimitExceeded"
    status = status_of(run)
    assert (status.state, status.exit_code) == (ExecutorState.FAILED, 1)
    run = reconciled(run)
    assert run.status == RunStatus.FAILED
    assert run.failure_reason.startswith(
        f"runner exited with code 1 (some or all measurements failed) in Pod {pod.metadata.name} "
        "without reporting a result; last lines of its log:\n"
    )
    assert run.failure_reason.endswith("RuntimeError: CUDA error: illegal memory access")
    # The log tail, from the termination message (no kubelet serves the log here).
    logs = get_executor("kubernetes").logs(run.executor_handle, tail=2)
    assert (
        logs
        == "Traceback (most recent call last):\nRuntimeError: CUDA error: illegal memory access"
    )


def test_an_oom_kill_fails_the_run_saying_so(k8s, make_run, kubelet):
    run = dispatched(make_run, spec=gpu_spec(memory="48Gi"))
    name = run.executor_handle["job"]
    pod = kubelet.pod_of(name)
    kubelet.running(pod)
    kubelet.terminated(pod, 137, reason="OOMKilled")
    kubelet.job_condition(name)
    run = reconciled(run)
    assert run.status == RunStatus.FAILED
    assert run.failure_reason.startswith(
        "the runner ran out of memory (OOMKilled: the container exceeded its memory limit of "
        "48Gi; exit code 137); raise resources.memory"
    )


def test_an_image_that_cannot_be_pulled_fails_the_run_after_the_grace(
    k8s, make_run, kubelet, kube_api
):
    run = dispatched(make_run)
    handle = run.executor_handle
    pod = kubelet.pod_of(handle["job"])
    started(kube_api, run)
    kubelet.waiting(pod, "ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')
    # Inside the grace a registry hiccup may still resolve: pending, the run waits.
    status = status_of(run)
    assert status.state == ExecutorState.PENDING
    assert (
        status.reason
        == f'pulling the image {IMAGE} failed, the node retries: Back-off pulling image "{IMAGE}"'
    )
    assert reconciled(run).status == RunStatus.DISPATCHED
    # Kubernetes never ends such a Pod by itself; after the grace the executor does.
    k8s.SERVEBENCH_K8S_START_GRACE_SECONDS = 0
    run = reconciled(run)
    assert run.status == RunStatus.FAILED
    assert f'image pull failed: {IMAGE}: Back-off pulling image "{IMAGE}" (ImagePullBackOff)' in (
        run.failure_reason
    )
    assert "SERVEBENCH_K8S_IMAGE_PULL_SECRETS" in run.failure_reason
    # ...and ends the Job, so its Pod stops holding a GPU; the reason stays on the Job.
    assert kubelet.job_condition(handle["job"]).reason == "DeadlineExceeded"
    core = client.CoreV1Api(kube_api)
    wait_for(
        lambda: (
            not core.list_namespaced_pod(
                handle["namespace"], label_selector=f"job-name={handle['job']}"
            ).items
        ),
        30,
        "the Job controller to delete the stuck Pod",
    )
    status = status_of(run)
    assert status.state == ExecutorState.FAILED
    assert status.reason.startswith(f"image pull failed: {IMAGE}: ")


def test_an_invalid_image_name_fails_at_once(k8s, make_run, kubelet, settings):
    # An admin allowed it (SERVEBENCH_ALLOWED_RUNNER_IMAGES), but the node cannot parse it.
    settings.SERVEBENCH_ALLOWED_RUNNER_IMAGES = ["Registry.Example/*"]
    run = dispatched(make_run, spec=gpu_spec(image="Registry.Example/UPPER:tag"))
    pod = kubelet.pod_of(run.executor_handle["job"])
    kubelet.waiting(
        pod, "InvalidImageName", 'couldn\'t parse image reference "Registry.Example/UPPER:tag"'
    )
    run = reconciled(run)
    assert run.status == RunStatus.FAILED
    assert "image pull failed: Registry.Example/UPPER:tag: couldn't parse image reference" in (
        run.failure_reason
    )


def test_no_free_gpu_keeps_the_run_waiting_and_the_log_endpoint_says_why(
    k8s, make_run, kubelet, personas
):
    run = dispatched(make_run, owner=personas["owner"].user)
    pod = kubelet.pod_of(run.executor_handle["job"])
    kubelet.unschedulable(pod, GPU_FULL)
    status = status_of(run)
    assert (status.state, status.reason) == (
        ExecutorState.PENDING,
        f"waiting for a GPU: {GPU_FULL}",
    )
    assert reconciled(run).status == RunStatus.DISPATCHED

    url = f"/api/v1/runs/{run.public_id}/logs"
    response = personas["owner"].client.get(url)
    assert response.status_code == 200, response.content
    assert response.json() == {
        "lines": "",
        "source": "kubernetes",
        "note": f"waiting for a GPU: {GPU_FULL}",
    }
    assert personas["other"].client.get(url).status_code == 404
    assert personas["anon"].client.get(url).status_code == 401
    Run.objects.filter(pk=run.pk).update(is_public=True)
    assert personas["other"].client.get(url).status_code == 403  # readable, logs are not
    assert personas["owner"].client.get(url + "?tail=0").status_code == 400


def test_a_portal_deadline_before_the_runner_started_says_why(k8s, make_run, kubelet):
    run = dispatched(make_run)
    kubelet.unschedulable(kubelet.pod_of(run.executor_handle["job"]), GPU_FULL)
    Run.objects.filter(pk=run.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    run = reconciled(run)
    assert run.status == RunStatus.FAILED
    assert run.failure_reason == (
        f"deadline exceeded after {run.timeout_minutes} min before the runner started: "
        f"waiting for a GPU: {GPU_FULL}"
    )


def test_the_jobs_deadline_fails_the_run(k8s, make_run, kube_api, kubelet):
    run = dispatched(make_run)
    handle = run.executor_handle
    kubelet.pod_of(handle["job"])
    started(kube_api, run)
    time.sleep(1.1)
    # Shrink the deadline the executor set (10 min) so the real Job controller enforces it.
    client.BatchV1Api(kube_api).patch_namespaced_job(
        handle["job"], handle["namespace"], {"spec": {"activeDeadlineSeconds": 1}}
    )
    assert kubelet.job_condition(handle["job"]).reason == "DeadlineExceeded"
    run = reconciled(run)
    assert run.status == RunStatus.FAILED
    assert run.failure_reason == (
        "deadline exceeded: Kubernetes stopped the Job after its "
        "activeDeadlineSeconds (1 s); raise resources.timeout_minutes or measure fewer points"
    )


def test_a_job_deleted_by_someone_fails_the_run(k8s, make_run, kube_api):
    run = dispatched(make_run)
    handle = run.executor_handle
    client.BatchV1Api(kube_api).delete_namespaced_job(
        handle["job"], handle["namespace"], propagation_policy="Background"
    )
    run = reconciled(run)
    assert run.status == RunStatus.FAILED
    assert run.failure_reason == (
        f"runner lost: the Job {handle['namespace']}/{handle['job']} was deleted (by a person, "
        "a namespace cleanup or its TTL) before the runner reported a result"
    )


def test_cancel_deletes_the_job_with_its_pod_and_secret(k8s, make_run, kube_api, kubelet):
    run = dispatched(make_run)
    handle = run.executor_handle
    ns, name = handle["namespace"], handle["job"]
    kubelet.running(kubelet.pod_of(name))
    assert lifecycle.cancel_run(run)
    assert dispatcher.stop_run(run.pk)  # what the stop task does
    core, batch = client.CoreV1Api(kube_api), client.BatchV1Api(kube_api)

    def gone(read: Any, *args: Any) -> bool:
        try:
            read(*args)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(lambda: gone(batch.read_namespaced_job, name, ns), 90, "the Job to be deleted")
    # Foreground: the Job went last, after the garbage collector deleted what it owned.
    assert core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items == []
    assert gone(core.read_namespaced_secret, name, ns)
    assert status_of(run).state == ExecutorState.GONE
    get_executor("kubernetes").cancel(handle)  # again: a 404 is fine


# --------------------------------------------------------------------------- errors


def test_a_job_the_api_server_rejects_fails_the_run_with_its_reason(k8s, make_run):
    run = make_run(spec=gpu_spec(node_selector={"servebench.dev/zone": "a:b"}))
    assert dispatcher.dispatch_run(run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_reason.startswith(
        "the kubernetes executor could not start the run: the Kubernetes API rejected "
        f"create Job {k8s.SERVEBENCH_K8S_NAMESPACE}/servebench-run-{run.public_id}: "
    )
    assert 'spec.template.spec.nodeSelector: Invalid value: "a:b"' in run.failure_reason


@pytest.mark.parametrize(
    ("change", "spec", "reason"),
    [
        (
            {"SERVEBENCH_K8S_NAMESPACE": "no-such-namespace"},
            None,
            "the namespace 'no-such-namespace' does not exist in the cluster; create it or "
            "set SERVEBENCH_K8S_NAMESPACE",
        ),
        (
            {"SERVEBENCH_K8S_RUNNER_IMAGE": ""},
            None,
            "no runner image: set resources.image in the spec, or SERVEBENCH_K8S_RUNNER_IMAGE",
        ),
        (
            {"SERVEBENCH_K8S_MAX_GPUS": 8},
            gpu_spec(gpu_count=16),
            "resources.gpu_count is 16 but runner Jobs here may ask for at most 8 GPUs "
            "(SERVEBENCH_K8S_MAX_GPUS",
        ),
        (
            {"SERVEBENCH_K8S_KUBECONFIG": "/nonexistent/kubeconfig"},
            None,
            "the Kubernetes executor has no usable cluster configuration (",
        ),
    ],
    ids=["missing-namespace", "no-image", "too-many-gpus", "no-kubeconfig"],
)
def test_a_run_that_cannot_become_a_job_fails_with_a_reason(k8s, make_run, change, spec, reason):
    for key, value in change.items():
        setattr(k8s, key, value)
    run = make_run(spec=spec or gpu_spec())
    assert dispatcher.dispatch_run(run.pk) == "failed"
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_reason.startswith(
        f"the kubernetes executor could not start the run: {reason}"
    ), run.failure_reason


def test_an_unreachable_api_server_keeps_the_claim_and_the_retry_starts_it(
    k8s, make_run, tmp_path, control_plane, namespace, kube_api
):
    port = free_port()  # nothing listens there
    reachable = k8s.SERVEBENCH_K8S_KUBECONFIG
    k8s.SERVEBENCH_K8S_KUBECONFIG = control_plane.kubeconfig_for(
        tmp_path / "kubeconfig", f"https://127.0.0.1:{port}", namespace
    )
    run = make_run(spec=gpu_spec())
    with pytest.raises(ExecutorUnavailable) as info:
        dispatcher.dispatch_run(run.pk)
    assert f"the Kubernetes API (https://127.0.0.1:{port}, kubeconfig " in str(info.value)
    assert "did not answer create Job" in str(info.value) and "after 2 attempts" in str(info.value)
    run.refresh_from_db()
    # Claimed with its Job's name, never created: the task's retry (or reconcile) starts it.
    assert run.status == RunStatus.DISPATCHED
    assert run.executor_handle["job"] == kubejob.job_name(run.public_id)
    assert "uid" not in run.executor_handle
    k8s.SERVEBENCH_K8S_KUBECONFIG = reachable
    assert status_of(run).state == ExecutorState.NOT_STARTED
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    run.refresh_from_db()
    assert run.executor_handle["uid"] == job_of(kube_api, run).metadata.uid
    assert run.executor_handle["attempts"] == 2


class FlakyProxy(ThreadingHTTPServer):
    """An HTTP front for the real API server that first answers with the given statuses."""

    daemon_threads = True

    def __init__(self, upstream: str, ca: str, failures: list[int]) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream, self.ca, self.failures, self.seen = upstream, ca, failures, []


class _ProxyHandler(BaseHTTPRequestHandler):
    server: FlakyProxy

    def log_message(self, *args: Any) -> None:
        pass

    def _relay(self) -> None:
        import ssl

        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(f"{self.command} {self.path}")
        if self.server.failures:
            code = self.server.failures.pop(0)
            payload = json.dumps({"kind": "Status", "status": "Failure", "code": code,
                                  "message": "the server is busy"}).encode()  # fmt: skip
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        wanted = ("authorization", "content-type", "accept")
        headers = {k: v for k, v in self.headers.items() if k.lower() in wanted}
        if body and "Content-Type" not in self.headers:  # the client leaves JSON implied
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(  # noqa: S310 (our own https URL)
            self.server.upstream + self.path,
            data=body or None,
            headers=headers,
            method=self.command,
        )
        context = ssl.create_default_context(cafile=self.server.ca)
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as resp:  # noqa: S310
                code, payload, ctype = resp.status, resp.read(), resp.headers.get("Content-Type")
        except urllib.error.HTTPError as exc:
            code, payload, ctype = exc.code, exc.read(), exc.headers.get("Content-Type")
        self.send_response(code)
        self.send_header("Content-Type", ctype or "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _relay


@pytest.fixture
def flaky_proxy(control_plane: Any) -> Iterator[FlakyProxy]:
    proxy = FlakyProxy(control_plane.server, str(control_plane.ca), [])
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    yield proxy
    proxy.shutdown()
    proxy.server_close()


def test_throttling_and_server_errors_are_retried(
    k8s, make_run, tmp_path, control_plane, namespace, flaky_proxy
):
    port = flaky_proxy.server_address[1]
    k8s.SERVEBENCH_K8S_KUBECONFIG = control_plane.kubeconfig_for(
        tmp_path / "kubeconfig", f"http://127.0.0.1:{port}", namespace
    )
    k8s.SERVEBENCH_K8S_API_ATTEMPTS = 3
    flaky_proxy.failures[:] = [503, 429]
    run = dispatched(make_run)  # two failures, then the create goes through
    creates = [s for s in flaky_proxy.seen if s.startswith("POST") and "/jobs" in s]
    assert len(creates) == 3
    # A server that keeps failing: the transient error surfaces as "unavailable".
    flaky_proxy.failures[:] = [503, 503, 503]
    with pytest.raises(
        ExecutorUnavailable, match=r"after 3 attempts: HTTP 503: the server is busy"
    ):
        get_executor("kubernetes").status(run.executor_handle)
