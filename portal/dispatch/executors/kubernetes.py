"""The Kubernetes executor: each run is a batch/v1 Job (``portal.dispatch.kubejob``).

Handle: ``{"namespace", "job", "run", "uid"}``. Everything else is asked of the API server
when needed, so any worker or web process can answer for any run.

- ``submit``: create the Job, then its Secret (spec + run token) owned by the Job. The Job
  name is derived from the run id, so 409 AlreadyExists means an earlier attempt already
  submitted it: we adopt that Job and (re)write its Secret with the current token, because
  the earlier attempt's token was revoked when that attempt failed.
- ``status``: from the Job's conditions and its Pod, each ending a distinct sentence:
  waiting for Kueue admission (a suspended Job with Kueue's queue label: pending, with
  ``queued_in`` set, so reconcile holds the run's deadline: the Job's own
  ``activeDeadlineSeconds`` does not count suspended time either), waiting for a GPU (the
  scheduler's message), image pull failed, out of memory, exit code
  with the container's termination message in the log tail, deadline exceeded, evicted,
  the Job was deleted. A Pod that can never start by itself (its image cannot be pulled,
  its container cannot be created) is reported as ``failed`` once it has been stuck for
  ``SERVEBENCH_K8S_START_GRACE_SECONDS``: Kubernetes would retry it until the deadline,
  holding its GPU, while reconcile needs an ended state to fail the run. So status() also
  ends such a Job (the one side effect it has): it writes the reason on the Job as the
  annotation ``servebench.dev/failure`` and lowers its ``activeDeadlineSeconds`` so the Job
  controller stops the Pod now; later calls return the recorded reason.
- ``cancel``: delete the Job with foreground propagation (its Pod and Secret go first).
- ``logs``: the Pod's log tail, one attempt with a short timeout (the run page calls it
  while rendering); when the kubelet cannot serve it (node gone, container never started)
  the container's termination message, which ``FallbackToLogsOnError`` fills with the end
  of the log. Empty when there is no Pod yet.

Transient API errors are retried with backoff (``portal.dispatch.kubeapi``) and then raise
``ExecutorUnavailable``; dispatch and reconcile try again on their next pass.
"""

from __future__ import annotations

import logging
import re
import signal
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from django.conf import settings
from kubernetes import client
from kubernetes.client.rest import ApiException

from portal.dispatch import kubeapi, kubejob
from portal.dispatch.executors.base import (
    Executor,
    ExecutorError,
    ExecutorState,
    ExecutorStatus,
    ExecutorUnavailable,
    Handle,
    report_url,
)

if TYPE_CHECKING:
    from portal.benchmarks.models import Run

log = logging.getLogger(__name__)

# Waiting reasons of a container whose image cannot be pulled. The first two retry with
# backoff and may recover (a registry hiccup); the others never will.
IMAGE_PULL_RETRYING = frozenset({"ErrImagePull", "ImagePullBackOff", "RegistryUnavailable"})
IMAGE_PULL_PERMANENT = frozenset(
    {"InvalidImageName", "ErrImageNeverPull", "SignatureValidationFailed"}
)
# The image is there but the container cannot be made: a missing Secret or ConfigMap, a
# bad command. The kubelet retries forever.
CONTAINER_BROKEN = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)

# What the runner's own exit codes mean (runners/cli.py).
RUNNER_EXIT_CODES = {
    1: "some or all measurements failed",
    2: "usage error or invalid spec",
    130: "interrupted",
}
LOG_BYTES = 256 * 1024
# The content digest in a container status' imageID ('repo@sha256:...', 'docker-pullable://
# repo@sha256:...', or a bare 'sha256:...' for an image the node had locally).
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# Why the executor ended a Job whose Pod could never start (see the module docstring).
FAILURE_ANNOTATION = "servebench.dev/failure"


def _now() -> datetime:
    return datetime.now(UTC)


def _seconds(value: int | None) -> str:
    return f"{value} s" if value is not None else "its limit"


class KubernetesExecutor(Executor):
    name = "kubernetes"

    def __init__(
        self,
        runner: kubejob.RunnerConfig | None = None,
        namespace: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        timeout: float | None = None,
        attempts: int | None = None,
        stuck_grace_seconds: float | None = None,
    ) -> None:
        """Nothing here touches the network: ``get_executor()`` builds one per call."""
        s = settings
        self.runner = runner or kubejob.RunnerConfig.from_settings()
        self._namespace = namespace if namespace is not None else s.SERVEBENCH_K8S_NAMESPACE
        self.kubeconfig = kubeconfig if kubeconfig is not None else s.SERVEBENCH_K8S_KUBECONFIG
        self.context = context if context is not None else s.SERVEBENCH_K8S_CONTEXT
        self.timeout = float(timeout if timeout is not None else s.SERVEBENCH_K8S_REQUEST_TIMEOUT)
        self.attempts = int(attempts if attempts is not None else s.SERVEBENCH_K8S_API_ATTEMPTS)
        self.stuck_grace = float(
            stuck_grace_seconds
            if stuck_grace_seconds is not None
            else s.SERVEBENCH_K8S_START_GRACE_SECONDS
        )
        # The run page waits for logs(): a short budget, no retries.
        self.log_timeout = min(self.timeout, 3.0)
        self._kube: kubeapi.Kube | None = None

    @property
    def kube(self) -> kubeapi.Kube:
        if self._kube is None:
            conn = kubeapi.connection(self.kubeconfig, self.context)
            self._kube = kubeapi.Kube(conn, timeout=self.timeout, attempts=self.attempts)
        return self._kube

    @property
    def namespace(self) -> str:
        """SERVEBENCH_K8S_NAMESPACE, else the config source's (the pod's own in-cluster)."""
        return self._namespace or self.kube.conn.namespace

    # ----------------------------------------------------------------- submit

    def handle_for(self, run: Run) -> Handle:
        """The Job's name and namespace follow from the run id; ``uid`` is added once the
        Job exists, so a handle without it names a Job that may never have been created."""
        return {
            "namespace": self.namespace,
            "job": kubejob.job_name(run.public_id),
            "run": run.public_id,
        }

    def submit(self, run: Run, token: str) -> Handle:
        kube, ns = self.kube, self.namespace
        permalink = f"{settings.SERVEBENCH_PUBLIC_URL}{run.get_absolute_url()}"
        url = (
            f"{self.runner.report_base_url}/api/v1/runner/runs/{run.public_id}"
            if self.runner.report_base_url
            else report_url(run)
        )
        job = kubejob.build_job(
            run.public_id, run.spec, url, self.runner, permalink, owner=run.owner.get_username()
        )
        name = job.metadata.name
        try:
            created = kube.call(
                f"create Job {ns}/{name}", kube.batch.create_namespaced_job, ns, job
            )
        except ApiException as exc:
            if exc.status == 404:
                raise ExecutorError(
                    f"the namespace {ns!r} does not exist in the cluster; create it or set "
                    "SERVEBENCH_K8S_NAMESPACE (the Helm chart's runner.namespace)"
                ) from None
            created = self._adopt(run, ns, name)  # 409: an earlier attempt created it
        self._write_secret(created, run, token)
        log.info("kubernetes: Job %s/%s submitted", ns, name)
        return {
            "namespace": ns,
            "job": name,
            "run": run.public_id,
            "uid": created.metadata.uid,
        }

    def _adopt(self, run: Run, ns: str, name: str) -> client.V1Job:
        kube = self.kube
        try:
            existing = kube.call(f"read Job {ns}/{name}", kube.batch.read_namespaced_job, name, ns)
        except ApiException as exc:  # deleted between our create and this read
            raise ExecutorUnavailable(
                f"the Job {ns}/{name} already existed but then vanished ({exc.status}); "
                "submitting again"
            ) from None
        if existing.metadata.deletion_timestamp is not None:
            raise ExecutorUnavailable(
                f"the Job {ns}/{name} from an earlier attempt is still being deleted; "
                "submitting again once it is gone"
            )
        labels = existing.metadata.labels or {}
        if labels.get(kubejob.RUN_LABEL) != kubejob.label_value(run.public_id):
            raise ExecutorError(
                f"a Job named {ns}/{name} exists but does not belong to this run (label "
                f"{kubejob.RUN_LABEL}={labels.get(kubejob.RUN_LABEL)!r}); delete it"
            )
        log.info("kubernetes: Job %s/%s already exists; adopting it", ns, name)
        return existing

    def _write_secret(self, job: client.V1Job, run: Run, token: str) -> None:
        kube, ns, name = self.kube, self.namespace, job.metadata.name
        secret = kubejob.build_secret(job, run.spec, token)
        try:
            try:
                kube.call(
                    f"create Secret {ns}/{name}", kube.core.create_namespaced_secret, ns, secret
                )
            except ApiException as exc:
                if exc.status != 409:
                    raise ExecutorError(
                        f"the Kubernetes API could not create Secret {ns}/{name}: "
                        f"{kubeapi.api_message(exc)}"
                    ) from None
                # Left by an earlier attempt whose token has since been revoked.
                manifest = kubejob.to_manifest(secret)
                body = {
                    "metadata": {"ownerReferences": manifest["metadata"]["ownerReferences"]},
                    "stringData": manifest["stringData"],
                }
                try:
                    kube.call(
                        f"update Secret {ns}/{name}",
                        kube.core.patch_namespaced_secret,
                        name,
                        ns,
                        body,
                    )
                except ApiException as exc:  # 404: deleted since; the retry creates it
                    raise ExecutorUnavailable(
                        f"the Secret {ns}/{name} changed while being updated "
                        f"({kubeapi.api_message(exc)}); submitting again"
                    ) from None
        except ExecutorUnavailable:
            raise  # the retry adopts the Job and writes the Secret again
        except ExecutorError:
            # Without its Secret the Pod can never start: do not leave a Job holding a GPU.
            try:
                self._delete_job(ns, name, attempts=1)
            except ExecutorError as exc:
                log.warning("kubernetes: could not delete Job %s/%s: %s", ns, name, exc)
            raise

    # ----------------------------------------------------------------- status

    def _pods(
        self, ns: str, handle: Handle, attempts: int | None = None, timeout: float | None = None
    ) -> list[client.V1Pod]:
        kube = self.kube
        # The runner's Pods, not the server Pods a runner creates (runners.kube).
        selector = (
            f"{kubejob.RUN_LABEL}={kubejob.label_value(handle.get('run', ''))},"
            f"app.kubernetes.io/component!={kubejob.SERVER_LABELS['app.kubernetes.io/component']}"
        )
        if not handle.get("run"):
            selector = f"job-name={handle['job']}"
        pods = kube.call(
            f"list the Pods of Job {ns}/{handle['job']}",
            kube.core.list_namespaced_pod,
            ns,
            label_selector=selector,
            attempts=attempts,
            timeout=timeout,
        ).items
        uid = handle.get("uid")
        if uid:  # only this Job's Pods, not those of an older Job of the same name
            pods = [
                p
                for p in pods
                if any(ref.uid == uid for ref in (p.metadata.owner_references or []))
            ]
        return sorted(pods, key=lambda p: p.metadata.creation_timestamp or _now())

    def status(self, handle: Handle) -> ExecutorStatus:
        return self._status(handle, act=True)

    def observe(self, handle: Handle) -> ExecutorStatus:
        """``status`` for readers (the logs endpoint, the run page): a Pod stuck past the
        grace is reported failed, but its Job is left for reconcile to stop."""
        return self._status(handle, act=False)

    def _status(self, handle: Handle, act: bool) -> ExecutorStatus:
        kube = self.kube
        ns, name = handle["namespace"], handle["job"]
        try:
            job = kube.call(f"read Job {ns}/{name}", kube.batch.read_namespaced_job, name, ns)
        except ApiException as exc:
            if exc.status == 404:
                if not handle.get("uid"):  # claimed, but the Job was never created
                    return ExecutorStatus(
                        ExecutorState.NOT_STARTED, reason=f"the Job {ns}/{name} was not created"
                    )
                return ExecutorStatus(
                    ExecutorState.GONE,
                    reason=(
                        f"the Job {ns}/{name} was deleted (by a person, a namespace cleanup or "
                        "its TTL) before the runner reported a result"
                    ),
                )
            raise ExecutorError(f"reading Job {ns}/{name}: {kubeapi.api_message(exc)}") from None
        if job.metadata.deletion_timestamp is not None:
            return ExecutorStatus(
                ExecutorState.GONE,
                reason=f"the Job {ns}/{name} is being deleted (cancelled, or deleted by a person)",
            )
        recorded = (job.metadata.annotations or {}).get(FAILURE_ANNOTATION)
        if recorded:
            return ExecutorStatus(ExecutorState.FAILED, reason=recorded)
        finished = _finished_condition(job)
        if finished is not None and finished.type == "Complete":
            return ExecutorStatus(ExecutorState.SUCCEEDED, exit_code=0)
        if finished is None:
            waiting = admission_wait(job)
            if waiting is not None:
                return waiting
        pods = self._pods(ns, handle)
        pod = pods[-1] if pods else None
        if finished is not None:  # Failed
            if finished.reason == "DeadlineExceeded":
                return _deadline(job)
            detail = _pod_failure(pod, job) if pod is not None else None
            return detail or ExecutorStatus(
                ExecutorState.FAILED,
                reason=(
                    f"the Job {ns}/{name} failed ({finished.reason}: {finished.message}); "
                    "its Pod is gone, so the exit code is unknown"
                ),
            )
        if pod is None:
            return ExecutorStatus(
                ExecutorState.PENDING,
                reason=(
                    "waiting for the Job controller to create the runner's Pod (if this "
                    f"lasts, see `kubectl describe job -n {ns} {name}` for quota or "
                    "admission errors)"
                ),
            )
        return self._pod_state(pod, job, act)

    def _pod_state(self, pod: client.V1Pod, job: client.V1Job, act: bool = True) -> ExecutorStatus:
        phase = pod.status.phase if pod.status else None
        if phase == "Succeeded":
            return ExecutorStatus(ExecutorState.SUCCEEDED, exit_code=0)
        if phase == "Failed":
            return _pod_failure(pod, job) or ExecutorStatus(
                ExecutorState.FAILED,
                reason=f"the runner's Pod {pod.metadata.name} failed: {_pod_words(pod)}",
            )
        if phase == "Running":
            return ExecutorStatus(ExecutorState.RUNNING)
        if phase == "Unknown":
            return ExecutorStatus(
                ExecutorState.RUNNING,
                reason=f"the node of Pod {pod.metadata.name} stopped reporting; waiting for it",
            )
        # Pending: not scheduled yet, or scheduled and starting.
        waiting = _waiting(pod)
        if waiting is not None and waiting.reason:
            stuck = self._stuck(pod, waiting)
            if stuck is not None:
                if stuck.state == ExecutorState.FAILED and act:
                    self._end_stuck_job(job, stuck.reason)
                return stuck
        scheduled = _condition(pod, "PodScheduled")
        if scheduled is not None and scheduled.status == "False":
            if scheduled.reason == "Unschedulable":
                gpu_names = {self.runner.gpu_resource, *self.runner.allowed_gpu_resources}
                wants_gpu = bool(gpu_names & set(_limits(pod)))
                what = "a GPU" if wants_gpu else "a node"
                return ExecutorStatus(
                    ExecutorState.PENDING,
                    reason=f"waiting for {what}: {scheduled.message or 'no node fits the Pod'}",
                )
            return ExecutorStatus(
                ExecutorState.PENDING,
                reason=f"waiting to be scheduled: {scheduled.reason}: {scheduled.message}",
            )
        if not pod.spec.node_name:
            return ExecutorStatus(ExecutorState.PENDING, reason="waiting to be scheduled")
        detail = f" ({waiting.reason})" if waiting is not None and waiting.reason else ""
        return ExecutorStatus(
            ExecutorState.PENDING,
            reason=f"the runner's Pod is starting on {pod.spec.node_name}{detail}",
        )

    def _stuck(
        self, pod: client.V1Pod, waiting: client.V1ContainerStateWaiting
    ) -> ExecutorStatus | None:
        """A failed state for a Pod that will not start by itself (after the grace), a
        pending one with the reason while inside the grace, None if it is not stuck."""
        reason, message = waiting.reason, (waiting.message or "").strip()
        created = pod.metadata.creation_timestamp or _now()
        stuck_for = (_now() - created).total_seconds()
        over = stuck_for >= self.stuck_grace
        if reason in IMAGE_PULL_RETRYING or reason in IMAGE_PULL_PERMANENT:
            image = _image(pod)
            if reason in IMAGE_PULL_PERMANENT or over:
                return ExecutorStatus(
                    ExecutorState.FAILED,
                    reason=(
                        f"image pull failed: {image}: {message or reason} ({reason}). Check "
                        "the image name and tag (resources.image or SERVEBENCH_K8S_RUNNER_IMAGE) "
                        "and the registry credentials (SERVEBENCH_K8S_IMAGE_PULL_SECRETS)"
                    ),
                )
            return ExecutorStatus(
                ExecutorState.PENDING,
                reason=f"pulling the image {image} failed, the node retries: {message or reason}",
            )
        if reason in CONTAINER_BROKEN:
            if over:
                return ExecutorStatus(
                    ExecutorState.FAILED,
                    reason=(
                        f"the runner's container could not be created ({reason}): "
                        f"{message or 'no message'}; check the Secrets and volumes the "
                        "runner Job refers to (SERVEBENCH_K8S_HF_TOKEN_SECRET, "
                        "SERVEBENCH_K8S_HF_CACHE_PVC)"
                    ),
                )
            return ExecutorStatus(
                ExecutorState.PENDING, reason=f"creating the container: {reason}: {message}"
            )
        return None

    def _end_stuck_job(self, job: client.V1Job, reason: str) -> None:
        """Record why on the Job and let the Job controller stop it now (its Pod holds a
        GPU and will never start). Best effort: the run fails either way."""
        kube, ns, name = self.kube, job.metadata.namespace, job.metadata.name
        body = {
            "metadata": {"annotations": {FAILURE_ANNOTATION: reason}},
            "spec": {"activeDeadlineSeconds": 1},
        }
        try:
            kube.call(f"stop Job {ns}/{name}", kube.batch.patch_namespaced_job, name, ns, body)
            log.info("kubernetes: stopped Job %s/%s: %s", ns, name, reason)
        except (ExecutorError, ApiException) as exc:
            log.warning(
                "kubernetes: could not stop Job %s/%s (%s); its deadline will", ns, name, exc
            )

    # ----------------------------------------------------------------- logs

    def logs(self, handle: Handle, tail: int = 50) -> str:
        """The runner's last ``tail`` log lines; "" when there is no Pod or nothing to say.
        Never raises for API trouble: it is called while rendering the run page."""
        tail = max(0, min(int(tail), 10_000))
        if tail == 0 or not handle:
            return ""
        ns = handle.get("namespace", "")
        try:
            kube = self.kube  # a broken configuration must not break the run page either
            pods = self._pods(ns, handle, attempts=1, timeout=self.log_timeout)
        except (ExecutorError, ApiException, KeyError) as exc:
            log.info("kubernetes: no log tail for %s: %s", handle.get("job"), exc)
            return ""
        if not pods:
            return ""
        pod = pods[-1]
        try:
            text = kube.call(
                f"read the log of Pod {ns}/{pod.metadata.name}",
                kube.core.read_namespaced_pod_log,
                pod.metadata.name,
                ns,
                container=kubejob.CONTAINER,
                tail_lines=tail,
                limit_bytes=LOG_BYTES,
                attempts=1,
                timeout=self.log_timeout,
            )
            if text:
                return _last_lines(str(text), tail)
        except (ExecutorError, ApiException) as exc:
            # 400 "waiting to start" / "has no host assigned", or the node is gone.
            log.debug("kubernetes: pod log unavailable, using the termination message: %s", exc)
        terminated = _terminated(pod)
        if terminated is not None and terminated.message:
            return _last_lines(terminated.message, tail)
        return ""

    # ----------------------------------------------------------------- image digest

    def image_digest(self, handle: Handle) -> str:
        """``sha256:...`` of the runner's image from its Pod's ``imageID`` (what the node's
        container runtime actually ran, whatever tag the Job named); "" when no Pod has
        started yet or the API cannot be reached (one attempt, short timeout)."""
        if not handle:
            return ""
        try:
            pods = self._pods(
                handle.get("namespace", ""), handle, attempts=1, timeout=self.log_timeout
            )
        except (ExecutorError, ApiException, KeyError) as exc:
            log.info("kubernetes: no image digest for %s: %s", handle.get("job"), exc)
            return ""
        for pod in reversed(pods):
            for status in (pod.status.container_statuses if pod.status else None) or []:
                if status.name == kubejob.CONTAINER:
                    found = _DIGEST.search(status.image_id or "")
                    if found:
                        return found.group(0)
        return ""

    # ----------------------------------------------------------------- cancel

    def cancel(self, handle: Handle) -> None:
        if not handle:
            return
        self._delete_job(handle["namespace"], handle["job"])

    def _delete_job(self, ns: str, name: str, attempts: int | None = None) -> None:
        """Foreground: the Job stays (with deletionTimestamp) until the garbage collector
        has deleted its Pod and Secret, so nothing outlives it. 404 means done already."""
        kube = self.kube
        try:
            kube.call(
                f"delete Job {ns}/{name}",
                kube.batch.delete_namespaced_job,
                name,
                ns,
                propagation_policy="Foreground",
                attempts=attempts,
            )
            log.info("kubernetes: Job %s/%s deleted", ns, name)
        except ApiException as exc:
            if exc.status != 404:
                raise ExecutorError(
                    f"deleting Job {ns}/{name}: {kubeapi.api_message(exc)}"
                ) from None


# --------------------------------------------------------------------------- reading objects


def admission_wait(job: client.V1Job) -> ExecutorStatus | None:
    """Pending, with the reason, while the Job is suspended (``spec.suspend``): with Kueue's
    queue label it waits for Kueue to admit it (``queued_in`` names the queue; also after a
    preemption put it back); without, someone suspended it. None when it is not."""
    if job.spec is None or not job.spec.suspend:
        return None
    ns, name = job.metadata.namespace, job.metadata.name
    queue = (job.metadata.labels or {}).get(kubejob.QUEUE_LABEL)
    if queue:
        return ExecutorStatus(
            ExecutorState.PENDING,
            reason=(
                f"waiting for Kueue admission in queue {queue} (the Job stays suspended until "
                f"its queue has quota; `kubectl get workloads -n {ns}` says why it waits)"
            ),
            queued_in=queue,
        )
    return ExecutorStatus(
        ExecutorState.PENDING,
        reason=f"the Job {ns}/{name} is suspended (spec.suspend); it starts when resumed",
    )


def _finished_condition(job: client.V1Job) -> client.V1JobCondition | None:
    for cond in (job.status.conditions if job.status else None) or []:
        if cond.type in ("Complete", "Failed") and cond.status == "True":
            return cond
    return None


def _condition(pod: client.V1Pod, kind: str) -> client.V1PodCondition | None:
    for cond in (pod.status.conditions if pod.status else None) or []:
        if cond.type == kind:
            return cond
    return None


def _container_status(pod: client.V1Pod) -> client.V1ContainerStatus | None:
    for status in (pod.status.container_statuses if pod.status else None) or []:
        if status.name == kubejob.CONTAINER:
            return status
    return None


def _waiting(pod: client.V1Pod) -> client.V1ContainerStateWaiting | None:
    status = _container_status(pod)
    return status.state.waiting if status is not None and status.state else None


def _terminated(pod: client.V1Pod) -> client.V1ContainerStateTerminated | None:
    status = _container_status(pod)
    if status is None:
        return None
    if status.state and status.state.terminated:
        return status.state.terminated
    if status.last_state and status.last_state.terminated:
        return status.last_state.terminated
    return None


def _runner_container(pod: client.V1Pod) -> client.V1Container | None:
    return next((c for c in pod.spec.containers if c.name == kubejob.CONTAINER), None)


def _limits(pod: client.V1Pod) -> dict[str, str]:
    container = _runner_container(pod)
    if container is None or container.resources is None:
        return {}
    return dict(container.resources.limits or {})


def _image(pod: client.V1Pod) -> str:
    container = _runner_container(pod)
    return container.image if container is not None else "(unknown image)"


def _pod_words(pod: client.V1Pod) -> str:
    status = pod.status
    return ": ".join(filter(None, [status.reason, status.message])) or "no reason given"


def _last_lines(text: str, n: int) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-n:])


def _deadline(job: client.V1Job) -> ExecutorStatus:
    seconds = job.spec.active_deadline_seconds
    minutes = (
        f" = resources.timeout_minutes {seconds // 60}" if seconds and seconds % 60 == 0 else ""
    )
    return ExecutorStatus(
        ExecutorState.FAILED,
        reason=(
            f"deadline exceeded: Kubernetes stopped the Job after its activeDeadlineSeconds "
            f"({_seconds(seconds)}{minutes}); raise resources.timeout_minutes or measure "
            "fewer points"
        ),
    )


def _pod_failure(pod: client.V1Pod, job: client.V1Job) -> ExecutorStatus | None:
    """Why a Pod failed, in words; None if it does not say."""
    status = pod.status
    if status.reason == "DeadlineExceeded":
        return _deadline(job)
    if status.reason == "Evicted":
        return ExecutorStatus(
            ExecutorState.FAILED,
            reason=(
                f"the runner's Pod was evicted from node {pod.spec.node_name or '?'}: "
                f"{status.message or 'no message'}"
            ),
        )
    terminated = _terminated(pod)
    if terminated is None:
        waiting = _waiting(pod)
        if waiting is not None and waiting.reason:
            return ExecutorStatus(
                ExecutorState.FAILED,
                reason=(
                    f"the runner's Pod failed before its container started ({waiting.reason}: "
                    f"{waiting.message or 'no message'})"
                ),
            )
        return None
    code = terminated.exit_code
    if terminated.reason == "OOMKilled":
        limit = _limits(pod).get("memory", "its limit")
        return ExecutorStatus(
            ExecutorState.FAILED,
            reason=(
                f"the runner ran out of memory (OOMKilled: the container exceeded its memory "
                f"limit of {limit}; exit code {code}); raise resources.memory (or "
                "SERVEBENCH_K8S_MEMORY_REQUEST), or lower the batch size / max_model_len"
            ),
            exit_code=code,
        )
    if code == 0:
        return None
    meaning = RUNNER_EXIT_CODES.get(code, "")
    if not meaning and code > 128:
        try:
            meaning = f"killed by {signal.Signals(code - 128).name}"
        except ValueError:
            meaning = ""
    words = f" ({meaning})" if meaning else ""
    return ExecutorStatus(
        ExecutorState.FAILED,
        reason=f"runner exited with code {code}{words} in Pod {pod.metadata.name}",
        exit_code=code,
    )
