"""The batch/v1 Job (and its Secret) that runs one run's runner on Kubernetes.

Kept apart from the executor so the manifest can be read, tested and reviewed on its own:
``build_job`` and ``build_secret`` are pure functions of the run and ``RunnerConfig``.

What the Job looks like, and why:

- Name ``servebench-run-<public_id>``: deterministic, so a second submit of the same run
  gets 409 AlreadyExists instead of a second GPU Job. Cut to 63 characters (a DNS label;
  the Job controller copies it into a label) with a hash suffix if it ever had to be cut.
- One container ``runner`` running ``python -m runners run /spec/spec.json --report URL
  --out /work/result.json``: the same contract as the local executor. The spec and the
  run-scoped token live in a Secret named like the Job: the spec mounted as a file, the
  token as ``SERVEBENCH_RUN_TOKEN`` through ``secretKeyRef`` (never in args or a literal
  env value, which ``kubectl describe`` prints). The Secret is owned by the Job
  (``ownerReferences``), so the garbage collector deletes it with the Job.
- GPUs as a limit of the configured extended resource (``nvidia.com/gpu``; a spec's
  ``resources.gpu_resource`` among the admin's allowed ones: a MIG slice
  ``nvidia.com/mig-1g.10gb``, ``amd.com/gpu``), written as a string quantity; none when
  every backend is an endpoint (a deployed server: the runner starts none, it only sends
  requests) or ``gpu_count`` is 0, and then no ``runtimeClassName`` either. An
  endpoint's API key Secret (``api_key.secret``) becomes the variable the runner reads it
  from (``EndpointBackend.key_env()``), optional so a missing Secret fails its points with
  a reason instead of keeping the Pod from starting. CPU and memory requests from the
  spec's resources or the settings; the memory limit equals the request, so a runaway
  process is OOMKilled (a reason the portal can name) instead of starving its neighbours.
- ``nodeSelector``: the spec's ``resources.node_selector`` (only the keys the admin allows,
  SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS) and ``resources.gpu_type`` as the value of the
  configured GPU label, then the settings' selector over them: the admin's placement
  always wins. Tolerations and affinity from the settings.
- Cluster placement the admin sets (``placement``; a spec may choose among allowed values,
  ``portal.benchmarks.policy.admin_choice`` decides, so the admin's values win): the Kueue
  label ``kueue.x-k8s.io/queue-name`` on the Job, which is then created suspended
  (``spec.suspend``) for Kueue to admit (a server without the field, before 1.21, drops it
  and runs the Job at once); ``priorityClassName``; ``runtimeClassName`` (e.g. ``nvidia``)
  on Pods that ask for a GPU.
- ``/dev/shm``: a memory-backed emptyDir (vLLM and NCCL need more than the 64 MB default),
  sized by ``shm_size``: the admin's size, raised to a size per GPU of the run's largest
  server (tensor x pipeline x data parallel), never above the admin's cap.
- The Hugging Face cache from a PVC when configured, so weights download once per cluster.
- ``backoffLimit: 0`` and ``restartPolicy: Never``: a benchmark that failed is a result,
  not something to retry silently on a maybe-different node. ``activeDeadlineSeconds``
  from ``resources.timeout_minutes``; ``ttlSecondsAfterFinished`` cleans up (the portal
  keeps the results and the log tail it needs).
- ``terminationMessagePolicy: FallbackToLogsOnError``: when the runner dies, the end of
  its log is kept in the Pod's status, which survives a node that is gone.
- ``automountServiceAccountToken: false``: the runner talks to the portal over HTTP with
  its run token; it has no business with the Kubernetes API, except to run its servers
  apart (below).
- Where the vLLM servers run (``server_placement``, SERVEBENCH_K8S_SERVER_PLACEMENT):
  ``separate`` (the default) puts each server configuration in a Pod of its own, apart
  from the load generator, the way it would be deployed. The runner Pod then asks for no
  GPU and the client's CPU and memory (SERVEBENCH_K8S_CLIENT_*), mounts its service
  account's token (the runner Role: Pods and their logs, in its namespace) and carries
  the server Pod in ``SERVEBENCH_SERVER_POD``: the image, the GPUs and the spec's CPU and
  memory, /dev/shm, the HF cache and token, and every placement above (node selector,
  tolerations, affinity, priority, runtime class). ``runners.kube`` creates it, owned by
  the runner's Pod (deleting the Job deletes it), and reaches it by Pod IP. A run with an
  HF baseline or ``transformers serve`` (both run inside the runner, on its GPUs), or with
  ``same-pod``, keeps everything in the runner's Pod. The Job's
  ``servebench.dev/server-placement`` annotation says which and why.
- Load generators (``policy.client_pods``): where a point runs several clients
  (``workload.clients`` above one, or ``auto``) and the run's models are all vLLM servers
  or endpoints, the runner Pod also carries ``SERVEBENCH_CLIENT_POD``: one load
  generator's Pod (the runner image, SERVEBENCH_K8S_LOADGEN_* CPU and memory, no GPU, the
  HF cache for the tokenizer, each endpoint's key from its Secret, the same placement),
  its own IP (``SERVEBENCH_POD_IP``, where its clients meet it) and its service account
  token. ``runners.clientpods`` creates one such Pod per client for each point.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from kubernetes import client

from portal.benchmarks.policy import SEPARATE, admin_choice, client_pods
from portal.benchmarks.policy import server_placement as server_placement_rule
from portal.dispatch.executors.base import ExecutorError
from runners import spec as rs
from runners.spec.resources import format_bytes, quantity_bytes

CONTAINER = "runner"
SPEC_DIR = "/spec"
SPEC_FILE = "spec.json"
WORK_DIR = "/work"
SECRET_SPEC_KEY = SPEC_FILE
SECRET_TOKEN_KEY = "run-token"  # noqa: S105 (the key's name, not a secret)
RUN_LABEL = "servebench.dev/run"
# Kueue's label naming the LocalQueue a Job waits in (on the Job only, not its Pod/Secret).
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NAME_PREFIX = "servebench-run-"
# Where a run's vLLM servers run (SERVEBENCH_K8S_SERVER_PLACEMENT): each in a Pod of its
# own with the GPUs, apart from the runner (the load generator), or in the runner's Pod.
PLACEMENT_ANNOTATION = "servebench.dev/server-placement"
SERVER_POD_ENV = "SERVEBENCH_SERVER_POD"  # runners.kube.POD_ENV
SERVER_CONTAINER = "server"  # runners.kube.CONTAINER
CLIENT_POD_ENV = "SERVEBENCH_CLIENT_POD"  # runners.clientpods.CLIENT_POD_ENV
CLIENT_CONTAINER = "client"  # runners.clientpods.CONTAINER

LABELS = {
    "app.kubernetes.io/name": "servebench",
    "app.kubernetes.io/component": "runner",
    "app.kubernetes.io/managed-by": "servebench-portal",
}
SERVER_LABELS = {"app.kubernetes.io/component": "server"}

_DNS_LABEL_MAX = 63


def job_name(public_id: str) -> str:
    """``servebench-run-<public_id>`` as a DNS-1123 label (lowercase, <= 63 chars)."""
    name = re.sub(r"[^a-z0-9-]+", "-", (NAME_PREFIX + public_id).lower()).strip("-")
    if len(name) > _DNS_LABEL_MAX:
        digest = hashlib.sha256(public_id.encode()).hexdigest()[:8]
        name = name[: _DNS_LABEL_MAX - 9].rstrip("-") + "-" + digest
    return name


def run_labels(public_id: str) -> dict[str, str]:
    """Our labels on the Job, its Pod and its Secret (``servebench.dev/run`` selects them)."""
    return {**LABELS, RUN_LABEL: label_value(public_id)}


def label_value(value: str) -> str:
    """A valid label value: alphanumerics, ``-_.``, at most 63 characters."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:_DNS_LABEL_MAX].strip("-_.")


@dataclass(frozen=True)
class RunnerConfig:
    """Deployment-wide defaults for runner Jobs (settings ``SERVEBENCH_K8S_*``)."""

    image: str = ""
    image_pull_policy: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    service_account: str = ""
    gpu_resource: str = "nvidia.com/gpu"
    gpu_type_label: str = "nvidia.com/gpu.product"
    max_gpus: int = 0
    cpu_request: str = "4"
    memory_request: str = "32Gi"
    shm_size: str = ""
    shm_per_gpu: str = ""
    shm_max: str = ""
    kueue_queue: str = ""
    kueue_allowed_queues: tuple[str, ...] = ()
    kueue_user_queues: dict[str, str] = field(default_factory=dict)
    priority_class: str = ""
    allowed_priority_classes: tuple[str, ...] = ()
    runtime_class: str = ""
    allowed_gpu_resources: tuple[str, ...] = ()
    node_selector: dict[str, str] = field(default_factory=dict)
    allowed_node_selector_keys: tuple[str, ...] = ()
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    affinity: dict[str, Any] = field(default_factory=dict)
    hf_cache_pvc: str = ""
    hf_home: str = "/root/.cache/huggingface"
    hf_token_secret: str = ""
    hf_token_key: str = "token"  # noqa: S105 (the key's name)
    ttl_seconds: int = 86400
    report_base_url: str = ""
    server_placement: str = SEPARATE
    runner_api_url: str = ""
    client_cpu_request: str = "2"
    client_memory_request: str = "8Gi"
    loadgen_cpu_request: str = "1"
    loadgen_memory_request: str = "4Gi"

    @classmethod
    def from_settings(cls) -> RunnerConfig:
        s = settings
        return cls(
            image=s.SERVEBENCH_K8S_RUNNER_IMAGE,
            image_pull_policy=s.SERVEBENCH_K8S_IMAGE_PULL_POLICY,
            image_pull_secrets=tuple(s.SERVEBENCH_K8S_IMAGE_PULL_SECRETS),
            service_account=s.SERVEBENCH_K8S_RUNNER_SERVICE_ACCOUNT,
            gpu_resource=s.SERVEBENCH_K8S_GPU_RESOURCE,
            gpu_type_label=s.SERVEBENCH_K8S_GPU_TYPE_LABEL,
            max_gpus=s.SERVEBENCH_K8S_MAX_GPUS,
            cpu_request=s.SERVEBENCH_K8S_CPU_REQUEST,
            memory_request=s.SERVEBENCH_K8S_MEMORY_REQUEST,
            shm_size=s.SERVEBENCH_K8S_SHM_SIZE,
            shm_per_gpu=s.SERVEBENCH_K8S_SHM_PER_GPU,
            shm_max=s.SERVEBENCH_K8S_SHM_MAX,
            kueue_queue=s.SERVEBENCH_K8S_KUEUE_QUEUE,
            kueue_allowed_queues=tuple(s.SERVEBENCH_K8S_KUEUE_ALLOWED_QUEUES),
            kueue_user_queues=dict(s.SERVEBENCH_K8S_KUEUE_USER_QUEUES),
            priority_class=s.SERVEBENCH_K8S_PRIORITY_CLASS,
            allowed_priority_classes=tuple(s.SERVEBENCH_K8S_ALLOWED_PRIORITY_CLASSES),
            runtime_class=s.SERVEBENCH_K8S_RUNTIME_CLASS,
            allowed_gpu_resources=tuple(s.SERVEBENCH_K8S_ALLOWED_GPU_RESOURCES),
            node_selector=dict(s.SERVEBENCH_K8S_NODE_SELECTOR),
            allowed_node_selector_keys=tuple(s.SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS),
            tolerations=list(s.SERVEBENCH_K8S_TOLERATIONS),
            affinity=dict(s.SERVEBENCH_K8S_AFFINITY),
            hf_cache_pvc=s.SERVEBENCH_K8S_HF_CACHE_PVC,
            hf_home=s.SERVEBENCH_K8S_HF_HOME,
            hf_token_secret=s.SERVEBENCH_K8S_HF_TOKEN_SECRET,
            hf_token_key=s.SERVEBENCH_K8S_HF_TOKEN_KEY,
            ttl_seconds=s.SERVEBENCH_K8S_TTL_SECONDS,
            report_base_url=s.SERVEBENCH_K8S_REPORT_URL,
            server_placement=s.SERVEBENCH_K8S_SERVER_PLACEMENT,
            runner_api_url=s.SERVEBENCH_K8S_RUNNER_API_URL,
            client_cpu_request=s.SERVEBENCH_K8S_CLIENT_CPU_REQUEST,
            client_memory_request=s.SERVEBENCH_K8S_CLIENT_MEMORY_REQUEST,
            loadgen_cpu_request=s.SERVEBENCH_K8S_LOADGEN_CPU_REQUEST,
            loadgen_memory_request=s.SERVEBENCH_K8S_LOADGEN_MEMORY_REQUEST,
        )


_plain_client: client.ApiClient | None = None


def _client() -> client.ApiClient:
    """A client used only to convert objects (never to call an API server)."""
    global _plain_client
    if _plain_client is None:
        _plain_client = client.ApiClient()
    return _plain_client


def typed(data: Any, klass: str) -> Any:
    """A plain JSON value (camelCase, as in a manifest) as a typed client object."""
    return _client().deserialize(json.dumps(data), klass, "application/json")


def to_manifest(obj: Any) -> dict[str, Any]:
    """A typed client object as the camelCase JSON the API server receives."""
    return _client().sanitize_for_serialization(obj)


def _env(name: str, value: str) -> client.V1EnvVar:
    return client.V1EnvVar(name=name, value=value)


def _field_env(name: str, path: str) -> client.V1EnvVar:
    return client.V1EnvVar(
        name=name,
        value_from=client.V1EnvVarSource(field_ref=client.V1ObjectFieldSelector(field_path=path)),
    )


def _secret_env(name: str, secret: str, key: str, optional: bool = False) -> client.V1EnvVar:
    ref = client.V1SecretKeySelector(name=secret, key=key, optional=optional or None)
    return client.V1EnvVar(name=name, value_from=client.V1EnvVarSource(secret_key_ref=ref))


def node_selector(resources: dict[str, Any], cfg: RunnerConfig) -> dict[str, str]:
    """The spec's selector (allowed keys only), its GPU type, then the settings' selector
    over both: the admin's placement wins. Submission refuses a spec that tries otherwise
    (``portal.benchmarks.policy``); this holds for runs stored before a setting changed."""
    allowed = set(cfg.allowed_node_selector_keys) - {cfg.gpu_type_label}
    selector = {
        str(k): str(v) for k, v in (resources.get("node_selector") or {}).items() if k in allowed
    }
    if resources.get("gpu_type") and cfg.gpu_type_label:
        selector[cfg.gpu_type_label] = str(resources["gpu_type"])
    selector.update(cfg.node_selector)
    return selector


@dataclass(frozen=True)
class Placement:
    """What the admin (and, where allowed, the spec) decided about where a Job runs."""

    queue: str  # Kueue LocalQueue, "" = not queued by Kueue
    priority_class: str  # "" = the cluster's default
    gpu_resource: str  # the extended resource the GPUs are asked as


def placement(resources: dict[str, Any], owner: str, cfg: RunnerConfig) -> Placement:
    """The spec's choices where the admin allows them, the admin's values otherwise; a
    queue the admin pinned for ``owner`` (a user name) always wins."""
    return Placement(
        queue=admin_choice(
            resources.get("queue"),
            cfg.kueue_queue,
            list(cfg.kueue_allowed_queues),
            cfg.kueue_user_queues.get(owner, ""),
        ),
        priority_class=admin_choice(
            resources.get("priority_class"), cfg.priority_class, list(cfg.allowed_priority_classes)
        ),
        gpu_resource=admin_choice(
            resources.get("gpu_resource"), cfg.gpu_resource, list(cfg.allowed_gpu_resources)
        ),
    )


def gpus_per_server(spec: dict[str, Any]) -> int:
    """GPUs the run's largest server uses (tensor x pipeline x data parallel of its vLLM
    backends), 1 when it starts none (an HF baseline is one process)."""
    sizes = [1]
    for item in spec.get("backends") or []:
        if isinstance(item, dict) and item.get("kind") == "vllm":
            try:
                sizes.append(rs.VLLMBackend.model_validate(item).gpus_per_server)
            except ValueError:
                continue
    return max(sizes)


def shm_size(spec: dict[str, Any], gpus: int, cfg: RunnerConfig) -> str:
    """The /dev/shm size limit: the admin's size (SERVEBENCH_K8S_SHM_SIZE), raised to
    SERVEBENCH_K8S_SHM_PER_GPU x ``gpus_per_server`` for a run with GPUs, capped at
    SERVEBENCH_K8S_SHM_MAX; "" (no limit) when none of them is set."""
    sizes = []  # (bytes, as written)
    if cfg.shm_size:
        sizes.append((quantity_bytes(cfg.shm_size), cfg.shm_size))
    if cfg.shm_per_gpu and gpus > 0:
        size = quantity_bytes(cfg.shm_per_gpu) * min(gpus_per_server(spec), gpus)
        sizes.append((size, format_bytes(size)))
    if cfg.shm_max:
        cap = (quantity_bytes(cfg.shm_max), cfg.shm_max)
        return min(max(sizes), cap)[1] if sizes else cap[1]
    return max(sizes)[1] if sizes else ""


def endpoint_backends(spec: dict[str, Any]) -> list[rs.EndpointBackend]:
    """The spec's endpoint backends (stored specs are valid; anything else is skipped)."""
    out = []
    for item in spec.get("backends") or []:
        if isinstance(item, dict) and item.get("kind") == "endpoint":
            try:
                out.append(rs.EndpointBackend.model_validate(item))
            except ValueError:
                continue
    return out


def server_placement(spec: dict[str, Any], cfg: RunnerConfig) -> tuple[str, str]:
    """(``separate`` or ``same-pod``, why) for this run under ``cfg``
    (``policy.server_placement``: the rule, which intake checks images against too)."""
    return server_placement_rule(spec, cfg.server_placement)


def build_job(
    public_id: str,
    spec: dict[str, Any],
    report_url: str,
    cfg: RunnerConfig,
    permalink: str = "",
    owner: str = "",
) -> client.V1Job:
    """The Job for one run of user ``owner`` (see the module docstring). Raises
    ExecutorError when the spec and the settings cannot make a runnable Job (no image, too
    many GPUs)."""
    resources = spec.get("resources") or {}
    image = resources.get("image") or cfg.image
    if not image:
        raise ExecutorError(
            "no runner image: set resources.image in the spec, or SERVEBENCH_K8S_RUNNER_IMAGE "
            "(the Helm chart's runner.image) for the deployment"
        )
    gpus = int(resources.get("gpu_count", 1))
    endpoints = endpoint_backends(spec)
    if endpoints and len(endpoints) == len(spec.get("backends") or []):
        gpus = 0  # only deployed servers to measure: nothing here needs a GPU
    if cfg.max_gpus and gpus > cfg.max_gpus:
        raise ExecutorError(
            f"resources.gpu_count is {gpus} but runner Jobs here may ask for at most "
            f"{cfg.max_gpus} GPUs (SERVEBENCH_K8S_MAX_GPUS, the largest node's count); "
            "lower gpu_count or tensor_parallel_size"
        )
    timeout_minutes = int(resources.get("timeout_minutes", 180))
    name = job_name(public_id)
    labels = run_labels(public_id)
    place = placement(resources, owner, cfg)
    where, why = server_placement(spec, cfg)
    separate = where == SEPARATE

    requests = {
        "cpu": str(resources.get("cpu") or cfg.cpu_request),
        "memory": str(resources.get("memory") or cfg.memory_request),
    }
    limits = {"memory": requests["memory"]}
    if gpus > 0:
        limits[place.gpu_resource] = str(gpus)  # a string: 1.20's apply rejects a bare int
    server_resources = client.V1ResourceRequirements(requests=requests, limits=limits)
    # Each load generator in a Pod of its own (workload.clients above one): the runner
    # creates them, so it needs its service account like a runner with server Pods.
    loadgen_pods = client_pods(spec, cfg.server_placement)
    if separate:  # the spec's resources are the server's; the load generator's are small
        requests = {"cpu": cfg.client_cpu_request, "memory": cfg.client_memory_request}
        limits = {"memory": requests["memory"]}
    loadgen = {"cpu": cfg.loadgen_cpu_request, "memory": cfg.loadgen_memory_request}

    model_env = [_env("PYTHONUNBUFFERED", "1"), _env("HF_HOME", cfg.hf_home)]
    if cfg.hf_token_secret:
        # optional: a missing Secret must not keep public models from running.
        model_env.append(_secret_env("HF_TOKEN", cfg.hf_token_secret, cfg.hf_token_key, True))
    env = [
        *model_env,
        _env("SERVEBENCH_IMAGE", image),
        _field_env("SERVEBENCH_NODE_NAME", "spec.nodeName"),
        _field_env("SERVEBENCH_POD_NAME", "metadata.name"),
        _field_env("SERVEBENCH_POD_NAMESPACE", "metadata.namespace"),
        _field_env("SERVEBENCH_POD_UID", "metadata.uid"),
        _field_env("SERVEBENCH_POD_IP", "status.podIP"),
        _secret_env("SERVEBENCH_RUN_TOKEN", name, SECRET_TOKEN_KEY),
    ]
    key_env = []  # each endpoint's key, from its Secret: the runner's and its clients'
    for backend in endpoints:
        key = backend.api_key
        if key is not None and key.secret is not None:
            key_env.append(_secret_env(str(backend.key_env()), key.secret, key.key, True))
    env += key_env

    # What a process that loads the model needs: /dev/shm, the Hugging Face cache.
    model_mounts = [
        client.V1VolumeMount(name="dshm", mount_path="/dev/shm"),  # noqa: S108 (the Pod's own)
    ]
    model_volumes = [
        client.V1Volume(
            name="dshm",
            empty_dir=client.V1EmptyDirVolumeSource(
                medium="Memory", size_limit=shm_size(spec, gpus, cfg) or None
            ),
        ),
    ]
    if cfg.hf_cache_pvc:
        model_mounts.append(client.V1VolumeMount(name="hf-cache", mount_path=cfg.hf_home))
        model_volumes.append(
            client.V1Volume(
                name="hf-cache",
                persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
                    claim_name=cfg.hf_cache_pvc
                ),
            )
        )
    mounts = [
        client.V1VolumeMount(name="spec", mount_path=SPEC_DIR, read_only=True),
        client.V1VolumeMount(name="work", mount_path=WORK_DIR),
        *model_mounts,
    ]
    volumes = [
        client.V1Volume(
            name="spec",
            secret=client.V1SecretVolumeSource(
                secret_name=name,
                items=[client.V1KeyToPath(key=SECRET_SPEC_KEY, path=SPEC_FILE)],
            ),
        ),
        client.V1Volume(name="work", empty_dir=client.V1EmptyDirVolumeSource()),
        *model_volumes,
    ]
    placed = {
        "node_selector": node_selector(resources, cfg) or None,
        "tolerations": [typed(t, "V1Toleration") for t in cfg.tolerations] or None,
        "affinity": typed(cfg.affinity, "V1Affinity") if cfg.affinity else None,
        "image_pull_secrets": [
            client.V1LocalObjectReference(name=n) for n in cfg.image_pull_secrets
        ]
        or None,
        "priority_class_name": place.priority_class or None,
    }
    runtime_class = (cfg.runtime_class or None) if gpus > 0 else None
    if separate:
        server_pod = client.V1Pod(
            metadata=client.V1ObjectMeta(labels={**labels, **SERVER_LABELS}),
            spec=client.V1PodSpec(
                containers=[
                    client.V1Container(
                        name=SERVER_CONTAINER,
                        image=image,
                        image_pull_policy=cfg.image_pull_policy or None,
                        env=model_env,
                        resources=server_resources,
                        volume_mounts=model_mounts,
                        termination_message_policy="FallbackToLogsOnError",
                    )
                ],
                volumes=model_volumes,
                runtime_class_name=runtime_class,
                automount_service_account_token=False,
                enable_service_links=False,
                **placed,
            ),
        )
        env.append(_env(SERVER_POD_ENV, json.dumps(to_manifest(server_pod), sort_keys=True)))
        if cfg.runner_api_url:
            env.append(_env("SERVEBENCH_KUBE_API_URL", cfg.runner_api_url))

    if loadgen_pods:
        client_pod = client.V1Pod(
            metadata=client.V1ObjectMeta(labels=dict(labels)),
            spec=client.V1PodSpec(
                containers=[
                    client.V1Container(
                        name=CLIENT_CONTAINER,
                        image=image,
                        image_pull_policy=cfg.image_pull_policy or None,
                        env=[*model_env, *key_env],  # the tokenizer's cache, the keys
                        resources=client.V1ResourceRequirements(
                            requests=loadgen, limits={"memory": loadgen["memory"]}
                        ),
                        volume_mounts=[m for m in model_mounts if m.name != "dshm"],
                        termination_message_policy="FallbackToLogsOnError",
                    )
                ],
                volumes=[v for v in model_volumes if v.name != "dshm"],
                automount_service_account_token=False,
                enable_service_links=False,
                **placed,
            ),
        )
        env.append(_env(CLIENT_POD_ENV, json.dumps(to_manifest(client_pod), sort_keys=True)))
        if cfg.runner_api_url and not separate:
            env.append(_env("SERVEBENCH_KUBE_API_URL", cfg.runner_api_url))

    command = [
        "python", "-m", "runners", "run", f"{SPEC_DIR}/{SPEC_FILE}",
        "--report", report_url,
        "--out", f"{WORK_DIR}/result.json",
        "--workdir", f"{WORK_DIR}/run",
    ]  # fmt: skip
    container = client.V1Container(
        name=CONTAINER,
        image=image,
        image_pull_policy=cfg.image_pull_policy or None,
        command=command,
        env=env,
        resources=client.V1ResourceRequirements(requests=requests, limits=limits),
        volume_mounts=mounts,
        termination_message_policy="FallbackToLogsOnError",
    )
    pod = client.V1PodSpec(
        restart_policy="Never",
        containers=[container],
        volumes=volumes,
        service_account_name=cfg.service_account or None,
        runtime_class_name=None if separate else runtime_class,
        # Only to create, watch and delete its server and client Pods (the runner Role).
        automount_service_account_token=separate or loadgen_pods,
        **placed,
        enable_service_links=False,  # thousands of env vars from Services help nobody here
        # vLLM's engine processes outlive their parent's wait when the server is stopped;
        # with a shared namespace the pause container is PID 1 and reaps them (no zombies
        # in a runner that is PID 1 of its own container).
        share_process_namespace=True,
    )
    annotations = {PLACEMENT_ANNOTATION: f"{where}: {why}"}
    if permalink:
        annotations["servebench.dev/permalink"] = permalink
    job_labels = {**labels, QUEUE_LABEL: place.queue} if place.queue else labels
    return client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(name=name, labels=job_labels, annotations=annotations),
        spec=client.V1JobSpec(
            # Kueue admits (unsuspends) it when its queue has quota; the Job's deadline
            # counts from then (Kubernetes resets startTime when a Job is resumed).
            suspend=True if place.queue else None,
            backoff_limit=0,
            completions=1,
            parallelism=1,
            active_deadline_seconds=timeout_minutes * 60,
            ttl_seconds_after_finished=cfg.ttl_seconds,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels, annotations=annotations),
                spec=pod,
            ),
        ),
    )


def build_secret(job: client.V1Job, spec: dict[str, Any], token: str) -> client.V1Secret:
    """The run's Secret (spec file + run token), owned by its Job for garbage collection."""
    meta = job.metadata
    return client.V1Secret(
        api_version="v1",
        kind="Secret",
        type="Opaque",
        metadata=client.V1ObjectMeta(
            name=meta.name,
            labels={k: v for k, v in (meta.labels or {}).items() if k != QUEUE_LABEL},
            owner_references=[
                client.V1OwnerReference(
                    api_version="batch/v1", kind="Job", name=meta.name, uid=meta.uid
                )
            ],
        ),
        string_data={SECRET_SPEC_KEY: json.dumps(spec, indent=2), SECRET_TOKEN_KEY: token},
    )
