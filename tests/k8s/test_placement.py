"""GPU cluster placement of runner Jobs (Kueue queue, PriorityClass, RuntimeClass, the GPU's
extended resource, /dev/shm for tensor parallelism), against a real kube-apiserver and Job
controller: each field is read back from the API server (and, where an admission plugin
acts on it, from the Pod the Job controller made), the admin's values win over a spec's,
and submission refuses what the admin does not allow, naming the field.

The test control plane is Kubernetes 1.20, which drops the Job field ``suspend`` (added in
1.21) like any unknown field: there the contract is the Kueue label, and ``suspend`` is
checked where the server keeps it. The executor's reading of a suspended Job is checked on
the Job it builds.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from k8s_support import GPU_TYPE, gpu_spec, wait_for
from kubernetes import client

from portal.accounts.models import ApiToken
from portal.benchmarks.models import Run, RunStatus
from portal.dispatch import dispatcher, kubejob
from portal.dispatch.executors import ExecutorState, ExecutorStatus
from portal.dispatch.executors.kubernetes import admission_wait
from runners import spec as rs

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(300)]

IMAGE = "registry.example.com/servebench-runner:test"
QUEUE, URGENT, TEAM = "benchmarks", "benchmarks-urgent", "team-a"
MIG = "nvidia.com/mig-1g.10gb"
# Cluster-scoped objects: names of this session's own.
_SUFFIX = uuid.uuid4().hex[:6]
LOW, HIGH, RUNTIME = f"sb-low-{_SUFFIX}", f"sb-high-{_SUFFIX}", f"sb-nvidia-{_SUFFIX}"
PRIORITY_VALUES = {LOW: 100, HIGH: 1000}
RUNS = "/api/v1/runs/"


def placement_settings(settings: Any) -> Any:
    """An admin's GPU cluster settings: a default Kueue queue, one more a spec may choose
    and one user pinned to a team queue; a default and an allowed PriorityClass; a
    RuntimeClass; MIG slices allowed; /dev/shm 1Gi, 2Gi per GPU, at most 6Gi."""
    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    settings.SERVEBENCH_GPU_TYPES = [GPU_TYPE]
    settings.SERVEBENCH_K8S_KUEUE_QUEUE = QUEUE
    settings.SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES = [URGENT]
    settings.SERVEBENCH_K8S_KUEUE_USER_QUEUES = {"pinned-user": TEAM}
    settings.SERVEBENCH_K8S_PRIORITY_CLASS = LOW
    settings.SERVEBENCH_K8S_ALLOWED_PRIORITY_CLASSES = [HIGH]
    settings.SERVEBENCH_K8S_RUNTIME_CLASS = RUNTIME
    settings.SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES = [MIG]
    settings.SERVEBENCH_K8S_SHM_SIZE = "1Gi"
    settings.SERVEBENCH_K8S_SHM_PER_GPU = "2Gi"
    settings.SERVEBENCH_K8S_SHM_MAX = "6Gi"
    return settings


@pytest.fixture(scope="module")
def cluster_classes(kube_api: Any) -> Any:
    """The PriorityClasses and the RuntimeClass the settings name: the API server's
    admission plugins refuse a Pod naming one that does not exist."""
    scheduling, node = client.SchedulingV1Api(kube_api), client.NodeV1Api(kube_api)
    for name, value in PRIORITY_VALUES.items():
        scheduling.create_priority_class(
            client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=value)
        )
    node.create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=RUNTIME), handler="nvidia")
    )
    yield
    for name in PRIORITY_VALUES:
        scheduling.delete_priority_class(name)
    node.delete_runtime_class(RUNTIME)


@pytest.fixture
def gpu_cluster(settings: Any, control_plane: Any, namespace: str, cluster_classes: None) -> Any:
    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    settings.SERVEBENCH_K8S_KUBECONFIG = str(control_plane.kubeconfig)
    settings.SERVEBENCH_K8S_NAMESPACE = namespace
    settings.SERVEBENCH_K8S_RUNNER_IMAGE = IMAGE
    settings.SERVEBENCH_K8S_API_ATTEMPTS = 2
    return placement_settings(settings)


def server_keeps_suspend(kube_api: Any) -> bool:
    """``spec.suspend`` exists from 1.21 (alpha, gated) and is on by default from 1.22."""
    version = client.VersionApi(kube_api).get_code()
    minor = int("".join(c for c in version.minor if c.isdigit()))
    return (int(version.major), minor) >= (1, 22)


def tp_spec(gpus: int = 2, **resources: Any) -> dict[str, Any]:
    """The GPU spec with one vLLM server using ``gpus`` GPUs (tensor parallel)."""
    spec = gpu_spec(gpu_count=gpus, **resources)
    spec["backends"] = [{"kind": "hf-sequential", "num_prompts": 4}]
    spec["backends"].append({"kind": "vllm", "tensor_parallel_size": gpus})
    return spec


def dispatched(make_run: Any, owner: Any = None, spec: dict[str, Any] | None = None) -> Run:
    run = make_run(owner=owner, spec=spec or tp_spec())
    assert dispatcher.dispatch_run(run.pk) == "submitted", Run.objects.get(pk=run.pk).failure_reason
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED
    return run


def job_of(kube_api: Any, run: Run) -> dict[str, Any]:
    handle = run.executor_handle
    job = client.BatchV1Api(kube_api).read_namespaced_job(handle["job"], handle["namespace"])
    return kubejob.to_manifest(job)


def pod_of(kube_api: Any, run: Run) -> Any:
    handle = run.executor_handle
    core = client.CoreV1Api(kube_api)

    def find() -> Any:
        pods = core.list_namespaced_pod(
            handle["namespace"], label_selector=f"job-name={handle['job']}"
        )
        return pods.items[0] if pods.items else None

    return wait_for(find, 90, f"the Job controller to create a Pod for {handle['job']}")


def runner_container(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


# --------------------------------------------------------------------------- the Job


def test_each_placement_field_is_in_the_created_job(gpu_cluster, make_run, make_user, kube_api):
    spec = tp_spec(2, queue=URGENT, priority_class=HIGH, gpu_resource=MIG)
    run = dispatched(make_run, make_user("placed"), spec)
    job = job_of(kube_api, run)
    assert job["metadata"]["labels"][kubejob.QUEUE_LABEL] == URGENT
    if server_keeps_suspend(kube_api):
        assert job["spec"]["suspend"] is True  # Kueue admits (unsuspends) it
    else:
        assert "suspend" not in job["spec"]  # 1.20 drops the field: no Kueue there
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == HIGH
    assert pod["runtimeClassName"] == RUNTIME
    container = runner_container(job)
    assert container["resources"]["limits"] == {"memory": "32Gi", MIG: "2"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # 2 GPUs per server x 2Gi, above the 1Gi default and below the 6Gi cap.
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    # The queue label is the Job's: Kueue reads it there, not on the Pod or the Secret.
    assert kubejob.QUEUE_LABEL not in job["spec"]["template"]["metadata"]["labels"]
    secret = client.CoreV1Api(kube_api).read_namespaced_secret(
        run.executor_handle["job"], run.executor_handle["namespace"]
    )
    assert kubejob.QUEUE_LABEL not in secret.metadata.labels
    if not server_keeps_suspend(kube_api):
        # The Pod the Job controller made went through the admission plugins: they found
        # the PriorityClass (its value is the Pod's priority) and the RuntimeClass.
        made = pod_of(kube_api, run)
        assert made.spec.priority_class_name == HIGH
        assert made.spec.priority == PRIORITY_VALUES[HIGH]
        assert made.spec.runtime_class_name == RUNTIME
        assert made.spec.containers[0].resources.limits[MIG] == "2"


def test_by_default_a_run_gets_the_admins_placement(gpu_cluster, make_run, kube_api):
    run = dispatched(make_run, spec=tp_spec(4))
    job = job_of(kube_api, run)
    assert job["metadata"]["labels"][kubejob.QUEUE_LABEL] == QUEUE
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == LOW and pod["runtimeClassName"] == RUNTIME
    assert runner_container(job)["resources"]["limits"]["nvidia.com/gpu"] == "4"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "6Gi"  # 4 x 2Gi, capped


def test_the_admins_values_win_over_the_specs(gpu_cluster, make_run, make_user, kube_api):
    """A run stored while its choices were allowed, dispatched after the admin changed
    the settings, and a user whose queue the admin pinned: the admin decides."""
    user = make_user("pinned-later")
    run = make_run(owner=user, spec=tp_spec(2, queue=URGENT, priority_class=HIGH, gpu_resource=MIG))
    gpu_cluster.SERVEBENCH_K8S_KUEUE_USER_QUEUES = {"pinned-later": TEAM}
    gpu_cluster.SERVEBENCH_K8S_ALLOWED_PRIORITY_CLASSES = []
    gpu_cluster.SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES = []
    gpu_cluster.SERVEBENCH_K8S_SHM_MAX = "3Gi"
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    run.refresh_from_db()
    job = job_of(kube_api, run)
    assert job["metadata"]["labels"][kubejob.QUEUE_LABEL] == TEAM
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == LOW
    assert runner_container(job)["resources"]["limits"] == {"memory": "32Gi", "nvidia.com/gpu": "2"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "3Gi"


@pytest.mark.parametrize(
    ("asked", "owner", "expected"),
    [
        ({}, "someone", kubejob.Placement(QUEUE, LOW, "nvidia.com/gpu")),
        (
            {"queue": URGENT, "priority_class": HIGH, "gpu_resource": MIG},
            "someone",
            kubejob.Placement(URGENT, HIGH, MIG),
        ),
        # Not allowed (a run stored before the settings changed): the admin's defaults.
        (
            {"queue": "elsewhere", "priority_class": "top", "gpu_resource": "amd.com/gpu"},
            "someone",
            kubejob.Placement(QUEUE, LOW, "nvidia.com/gpu"),
        ),
        # A pinned user's queue wins over an allowed choice.
        ({"queue": URGENT}, "pinned-user", kubejob.Placement(TEAM, LOW, "nvidia.com/gpu")),
    ],
)
def test_placement_takes_a_specs_choice_only_where_the_admin_allows_it(asked, owner, expected):
    cfg = kubejob.RunnerConfig(
        kueue_queue=QUEUE,
        kueue_allowed_queues=(URGENT,),
        kueue_user_queues={"pinned-user": TEAM},
        priority_class=LOW,
        allowed_priority_classes=(HIGH,),
        allowed_gpu_resources=(MIG,),
    )
    assert kubejob.placement(asked, owner, cfg) == expected


def test_without_placement_settings_the_job_is_unchanged(
    settings, control_plane, namespace, make_run, kube_api
):
    """None of the new fields unless an admin sets them: no Kueue label, not suspended,
    no priority or runtime class, the GPUs as nvidia.com/gpu."""
    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    settings.SERVEBENCH_K8S_KUBECONFIG = str(control_plane.kubeconfig)
    settings.SERVEBENCH_K8S_NAMESPACE = namespace
    settings.SERVEBENCH_K8S_RUNNER_IMAGE = IMAGE
    settings.SERVEBENCH_GPU_TYPES = [GPU_TYPE]
    run = dispatched(make_run, spec=tp_spec(2))
    job = job_of(kube_api, run)
    assert kubejob.QUEUE_LABEL not in job["metadata"]["labels"]
    assert "suspend" not in job["spec"]
    pod = job["spec"]["template"]["spec"]
    assert "priorityClassName" not in pod and "runtimeClassName" not in pod
    assert runner_container(job)["resources"]["limits"] == {"memory": "32Gi", "nvidia.com/gpu": "2"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory"}  # no limit, as before


def test_a_cpu_run_asks_for_no_gpu_and_no_runtime_class(gpu_cluster, make_run, kube_api):
    """gpu_count 0 (the CPU path): no GPU limit, whatever resource the spec names, no
    runtime class, /dev/shm at the default; Kueue still queues it (CPU and memory quota)."""
    spec = tp_spec(1, gpu_resource=MIG)
    spec["resources"]["gpu_count"] = 0
    spec["backends"] = [{"kind": "hf-sequential", "num_prompts": 4}]
    del spec["resources"]["gpu_type"]
    run = dispatched(make_run, spec=spec)
    job = job_of(kube_api, run)
    assert runner_container(job)["resources"]["limits"] == {"memory": "32Gi"}
    pod = job["spec"]["template"]["spec"]
    assert "runtimeClassName" not in pod
    assert pod["priorityClassName"] == LOW
    assert job["metadata"]["labels"][kubejob.QUEUE_LABEL] == QUEUE
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "1Gi"


def test_an_endpoint_only_job_asks_for_no_gpu():
    spec = {
        "backends": [{"kind": "endpoint", "base_url": "http://vllm.prod.svc:8000", "model": "m"}],
        "resources": {"gpu_count": 1, "gpu_resource": MIG},
    }
    cfg = kubejob.RunnerConfig(
        image=IMAGE, runtime_class=RUNTIME, allowed_gpu_resources=(MIG,), shm_per_gpu="8Gi"
    )
    job = kubejob.to_manifest(kubejob.build_job("endpointonly01", spec, "https://x/r", cfg))
    pod = job["spec"]["template"]["spec"]
    assert runner_container(job)["resources"]["limits"] == {"memory": "32Gi"}
    assert "runtimeClassName" not in pod
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"] == {"medium": "Memory"}


# --------------------------------------------------------------------------- submission


def submit(user: Any, spec: dict[str, Any]) -> Any:
    from portal.accounts.tokens import create_user_token

    token = create_user_token(user, "placement").plaintext
    api = Client(headers={"Authorization": f"Bearer {token}"})
    return api.post(RUNS, json.dumps({"spec": spec}), content_type="application/json")


def refusals(response: Any) -> dict[str, str]:
    assert response.status_code == 400, response.content[:500]
    return {f["field"]: f["message"] for f in response.json()["error"]["fields"]}


def test_submission_refuses_placement_the_admin_does_not_allow(settings, make_user):
    placement_settings(settings)
    user = make_user("asks-too-much")
    bad = tp_spec(2, queue="elsewhere", priority_class="top", gpu_resource="amd.com/gpu")
    before = Run.objects.count()
    fields = refusals(submit(user, bad))
    assert Run.objects.count() == before
    assert set(fields) == {
        "spec.resources.queue",
        "spec.resources.priority_class",
        "spec.resources.gpu_resource",
    }
    assert f"(allowed: {QUEUE}, {URGENT};" in fields["spec.resources.queue"]
    assert "SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES" in fields["spec.resources.queue"]
    assert f"(allowed: {LOW}, {HIGH};" in fields["spec.resources.priority_class"]
    assert f"(allowed: nvidia.com/gpu, {MIG};" in fields["spec.resources.gpu_resource"]
    # What the admin allows is accepted.
    good = tp_spec(2, queue=URGENT, priority_class=HIGH, gpu_resource=MIG)
    assert submit(user, good).status_code == 201


def test_a_pinned_user_may_name_only_their_queue(settings, make_user):
    placement_settings(settings)
    user = make_user("pinned-user")
    message = refusals(submit(user, tp_spec(2, queue=URGENT)))["spec.resources.queue"]
    assert f"your runs go to the Kueue queue {TEAM!r}" in message
    assert "SERVEBENCH_K8S_KUEUE_USER_QUEUES" in message
    assert submit(user, tp_spec(2, queue=TEAM)).status_code == 201


def test_without_kueue_a_spec_naming_a_queue_is_refused(settings, make_user):
    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    settings.SERVEBENCH_GPU_TYPES = [GPU_TYPE]
    message = refusals(submit(make_user("no-kueue"), tp_spec(2, queue=QUEUE)))
    assert "(allowed: none;" in message["spec.resources.queue"]
    assert "leave resources.queue out" in message["spec.resources.queue"]


@pytest.mark.parametrize(
    ("field", "value", "complaint"),
    [
        ("queue", "Team A", "is not a Kueue LocalQueue name"),
        ("queue", "q" * 64, "is not a Kueue LocalQueue name"),
        ("priority_class", "High_Priority", "is not a PriorityClass name"),
        ("gpu_resource", "gpu", "is not an extended resource name 'domain/name'"),
        ("gpu_resource", "kubernetes.io/gpu", "outside kubernetes.io"),
    ],
)
def test_the_spec_refuses_malformed_placement_names(field, value, complaint):
    with pytest.raises(rs.SpecError) as caught:
        rs.parse_spec(tp_spec(2, **{field: value}))
    (error,) = caught.value.errors
    assert error["field"] == f"resources.{field}"
    assert complaint in error["message"]


# --------------------------------------------------------------------------- waiting for Kueue


def test_a_suspended_job_is_queued_not_failed_or_lost():
    """What the executor's status reads from a Job Kueue has not admitted (the Job it
    builds: suspended, with the queue label): pending, naming the queue."""
    cfg = kubejob.RunnerConfig(image=IMAGE, kueue_queue=QUEUE)
    job = kubejob.build_job("queuedrun01", tp_spec(2), "https://x/r", cfg)
    job.metadata.namespace = "runs"
    assert job.spec.suspend is True
    status = admission_wait(job)
    assert status is not None and status.state == ExecutorState.PENDING and not status.ended
    assert status.queued_in == QUEUE
    assert status.reason.startswith(f"waiting for Kueue admission in queue {QUEUE}")
    # Suspended by someone, without Kueue: pending too, but its time counts.
    job.metadata.labels.pop(kubejob.QUEUE_LABEL)
    other = admission_wait(job)
    assert other is not None and other.state == ExecutorState.PENDING and other.queued_in == ""
    assert "is suspended (spec.suspend)" in other.reason
    job.spec.suspend = None
    assert admission_wait(job) is None


def test_time_waiting_for_kueue_does_not_count_against_the_deadline(
    gpu_cluster, make_run, kube_api
):
    """A run whose Job waited for Kueue past its timeout is not failed: its deadline (and
    its runner's token) stay ``timeout_minutes`` away while it waits, as the Job's own
    activeDeadlineSeconds does not count suspended time. A pending run that is not waiting
    for Kueue still fails at its deadline."""
    queued, pending = dispatched(make_run), dispatched(make_run)
    past = timezone.now() - timedelta(minutes=1)
    Run.objects.filter(pk__in=[queued.pk, pending.pk]).update(deadline=past)
    queued.refresh_from_db()
    cfg = kubejob.RunnerConfig.from_settings()
    job = kubejob.build_job(queued.public_id, queued.spec, "https://x/r", cfg)
    job.metadata.namespace = queued.executor_handle["namespace"]
    status = admission_wait(job)  # what the executor reads where the server keeps suspend
    now = timezone.now()
    assert dispatcher.hold_deadline(queued, status, now)
    queued.refresh_from_db()
    assert queued.deadline == now + timedelta(minutes=10)  # resources.timeout_minutes
    token = ApiToken.objects.get(run=queued, kind=ApiToken.Kind.RUN, revoked_at__isnull=True)
    assert token.expires_at == queued.deadline + dispatcher.TOKEN_GRACE
    # Not for a run whose runner is not waiting for admission.
    assert not dispatcher.hold_deadline(pending, ExecutorStatus(ExecutorState.PENDING), now)

    report = dispatcher.reconcile()
    assert pending.public_id in report.deadline and queued.public_id not in report.deadline
    assert Run.objects.get(pk=queued.pk).status == RunStatus.DISPATCHED
    assert Run.objects.get(pk=pending.pk).status == RunStatus.FAILED
