"""On Kubernetes, each server configuration's vLLM server in a Pod of its own.

The portal's Kubernetes executor (``portal.dispatch.kubejob``) decides where a run's
servers go. With ``separate`` placement the runner's Pod asks for no GPU and carries, in
``SERVEBENCH_SERVER_POD``, the Pod the server should run in: the runner image, the GPUs
and the spec's CPU and memory, node selector, tolerations, runtime class, shared memory
and Hugging Face cache, every policy the portal applies to runner Pods. ``PodServer``
(a ``VLLMServer`` to the rest of the runner) fills in what only the runner knows:

- the name ``<runner pod>-<backend>`` (cut to 63 characters), labels naming the
  backend, and an owner reference to the runner's Pod, so the garbage collector deletes
  the server when the runner's Pod goes (the Job deleted, cancelled, expired), even if
  the runner died without stopping it;
- the command: ``python -m vllm.entrypoints.openai.api_server`` with the same flags as a
  local server, listening on ``0.0.0.0:8000``.

It creates the Pod through the Kubernetes API with the runner Pod's service account
(``KubeAPI``: the standard library only, a timeout on every call; the Role allows Pods
create/get/list/delete and their logs in the runner's namespace; a call the API server
did not answer, or answered 429/5xx, is tried again with backoff: for up to
``API_RETRY_S`` while the API server has never answered (a wrong address fails fast), for
up to ``API_OUTAGE_S`` once it has (an API server restarting, or starved on a busy control
plane, must not fail a point whose Pods keep running); a create whose first answer was
lost finds its own Pod), waits for it to run and have an IP, then for ``GET /health`` on
``http://<pod IP>:8000`` (a Pod IP works in every cluster, without kube-proxy or cluster
DNS). A Pod that cannot start (its image cannot be pulled, it failed, it was not ready
before ``startup_timeout_s``) is a ``ServerError`` with the Pod's own reason and the last
lines of its log. Stopping saves the Pod's log in the runner's work directory, then
deletes the Pod and waits until it is gone. Each served point records the Pod, its node
and IP in its conditions; the run's environment lists every server Pod
(``kubernetes.server_pods``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import requests

from runners.egress import Egress
from runners.spec import Spec, VLLMBackend
from runners.vllm_server import SERVER_MODULE, ServerError, VLLMServer, serve_flags, server_env

POD_ENV = "SERVEBENCH_SERVER_POD"  # the server Pod's manifest (JSON), set by the portal
API_URL_ENV = "SERVEBENCH_KUBE_API_URL"  # where the API server is, when not the in-cluster one
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVER_PORT = 8000
CONTAINER = "server"
COMPONENT_LABEL = "app.kubernetes.io/component"
BACKEND_LABEL = "servebench.dev/backend"
API_TIMEOUT_S = 10.0
API_RETRY_S = 60.0  # how long a call is retried while the API server has never answered
API_OUTAGE_S = 300.0  # ... and once it has: an outage the runner rides out
TRANSIENT = {0, 429, 500, 502, 503, 504}  # 0: no answer (refused, reset, timed out)
POLL_S = 1.0
# A container waiting for one of these will not start by waiting longer.
HOPELESS = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
}
_DNS_LABEL_MAX = 63


class KubeError(RuntimeError):
    """An API call that failed: ``status`` (0: no answer) and the server's message."""

    def __init__(self, status: int, message: str, transient: bool | None = None) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.transient = status in TRANSIENT if transient is None else transient


class KubeAPI:
    """The few calls the runner makes, on one namespace, with a bearer token."""

    def __init__(
        self, base_url: str, token: str, namespace: str, ca_file: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.namespace = namespace
        self.context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self.timeout_s = API_TIMEOUT_S
        self.retry_s = API_RETRY_S
        self.outage_s = API_OUTAGE_S
        self.answered = False  # has the API server ever answered (any HTTP status)?

    @classmethod
    def in_cluster(cls, environ: dict[str, str] | None = None) -> KubeAPI:
        """The runner Pod's own service account: its token, CA and namespace, and the API
        server at ``SERVEBENCH_KUBE_API_URL`` or the in-cluster address."""
        env = os.environ if environ is None else environ
        url = env.get(API_URL_ENV, "").strip()
        if not url:
            host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
            if not host or not port:
                raise ServerError(
                    f"{POD_ENV} asks for the server in a Pod of its own, but this is not a "
                    f"Pod in a cluster (no KUBERNETES_SERVICE_HOST): set {API_URL_ENV}"
                )
            url = f"https://{'[' + host + ']' if ':' in host else host}:{port}"
        try:
            token = (SA_DIR / "token").read_text().strip()
        except OSError as exc:
            raise ServerError(
                f"{POD_ENV} asks for the server in a Pod of its own, but the runner Pod has "
                f"no service account token ({exc}): the portal mounts one for this placement"
            ) from None
        namespace = env.get("SERVEBENCH_POD_NAMESPACE") or _read(SA_DIR / "namespace")
        ca = SA_DIR / "ca.crt"
        return cls(url, token, namespace or "default", str(ca) if ca.exists() else None)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        text: bool = False,
    ) -> Any:
        """One request; the decoded JSON answer (``text``: as text); KubeError otherwise.

        A transient failure (no answer, 429, 5xx) is tried again, backing off from 0.5 s
        to 8 s, until ``retry_s`` has passed, or ``outage_s`` once the API server has
        answered this client before; the error then says how many tries it took."""
        began = time.monotonic()
        delay, tries = 0.5, 0
        while True:
            tries += 1
            try:
                answer = self._once(method, path, body, query, text)
            except KubeError as exc:
                spent = time.monotonic() - began
                window = self.outage_s if self.answered else self.retry_s
                if not exc.transient or spent + delay > window:
                    if tries == 1:
                        raise
                    raise KubeError(
                        exc.status,
                        f"{exc.args[0]} (after {tries} tries over {spent:.0f} s; is the API "
                        "server overloaded or unreachable from this Pod?)",
                        transient=exc.transient,
                    ) from None
            else:
                if tries > 1:  # the outage, in the runner's log: how long it lasted
                    spent = time.monotonic() - began
                    print(
                        f"kube: {method} {path} answered after {tries} tries over {spent:.0f} s",
                        file=sys.stderr,
                        flush=True,
                    )
                return answer
            time.sleep(delay)
            delay = min(delay * 2, 8.0)

    def _once(
        self, method: str, path: str, body: Any, query: dict[str, Any] | None, text: bool
    ) -> Any:
        url = f"{self.base_url}/api/v1/namespaces/{self.namespace}/{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(  # noqa: S310 (the API server's URL)
                req, timeout=self.timeout_s, context=self.context
            ) as resp:
                answer = resp.read().decode(errors="replace")
            self.answered = True
        except urllib.error.HTTPError as exc:
            self.answered = True
            answer = exc.read().decode(errors="replace")
            try:
                message = json.loads(answer).get("message", answer)
            except (ValueError, AttributeError):
                message = answer
            raise KubeError(exc.code, f"{method} {path}: {message[:500]}") from None
        except OSError as exc:
            raise KubeError(0, f"{method} {path}: the API server did not answer ({exc})") from None
        if text:
            return answer
        try:
            return json.loads(answer)
        except ValueError as exc:
            raise KubeError(
                0, f"{method} {path}: not JSON ({exc}): {answer[:200]}", transient=False
            ) from None

    def create_pod(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create the Pod. Where a retried create meets a Pod of that name with the same
        owner (the first try was made, its answer lost), that Pod is the one created."""
        try:
            return self.call("POST", "pods", manifest)
        except KubeError as exc:
            if exc.status != 409:
                raise
            name = manifest["metadata"]["name"]
            existing = self.pod(name)
            mine = [r.get("uid") for r in manifest["metadata"].get("ownerReferences") or []]
            theirs = [
                r.get("uid")
                for r in ((existing or {}).get("metadata") or {}).get("ownerReferences") or []
            ]
            terminating = ((existing or {}).get("metadata") or {}).get("deletionTimestamp")
            if existing is not None and mine and mine == theirs and not terminating:
                return existing
            raise

    def pod(self, name: str) -> dict[str, Any] | None:
        """The Pod, or None when there is none of that name."""
        try:
            return self.call("GET", f"pods/{name}")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def delete_pod(self, name: str, grace_s: int = 20) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": grace_s,
            "propagationPolicy": "Background",
        }
        try:
            self.call("DELETE", f"pods/{name}", body)
        except KubeError as exc:
            if exc.status != 404:
                raise

    def pod_log(self, name: str, container: str = CONTAINER, lines: int | None = None) -> str:
        query: dict[str, Any] = {"container": container}
        if lines:
            query["tailLines"] = lines
        return self.call("GET", f"pods/{name}/log", query=query, text=True)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def pod_name(runner_pod: str, backend: str) -> str:
    """``<runner pod>-<backend>`` as a DNS-1123 label, a hash suffix where it had to be cut."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"{runner_pod}-{backend}".lower()).strip("-")
    if len(name) > _DNS_LABEL_MAX:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = name[: _DNS_LABEL_MAX - 9].rstrip("-") + "-" + digest
    return name


def pod_template(
    variable: str,
    container: str,
    error: type[Exception],
    environ: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """The Pod manifest the portal put in ``variable`` (one container named
    ``container``), or None where it is unset; ``error`` for a malformed one."""
    text = (os.environ if environ is None else environ).get(variable, "").strip()
    if not text:
        return None
    try:
        template = json.loads(text)
    except ValueError as exc:
        raise error(f"{variable} is not JSON ({exc})") from None
    containers = (template.get("spec") or {}).get("containers") or []
    if [c.get("name") for c in containers] != [container]:
        raise error(f"{variable}: the Pod needs exactly one container named {container!r}")
    return template


def template_from_env(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The server Pod the portal asked for (``SERVEBENCH_SERVER_POD``), or None."""
    return pod_template(POD_ENV, CONTAINER, ServerError, environ)


def runner_owner(variable: str, what: str, error: type[Exception]) -> dict[str, str]:
    """The runner's Pod (name, uid), which owns the Pods it creates for ``what``."""
    name, uid = os.environ.get("SERVEBENCH_POD_NAME"), os.environ.get("SERVEBENCH_POD_UID")
    if not name or not uid:
        raise error(
            f"{variable} is set but SERVEBENCH_POD_NAME / SERVEBENCH_POD_UID are not: "
            f"{what} owned by the runner's Pod, which the portal names through them"
        )
    return {"name": name, "uid": uid}


def container_state(pod: dict[str, Any], container: str = CONTAINER) -> dict[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return status.get("state") or {}
    return {}


def why_not_running(pod: dict[str, Any] | None, container: str = CONTAINER) -> str | None:
    """Why this Pod will not serve (ended, or waiting for something that will not come),
    for a person; None while it runs or may still start."""
    if pod is None:
        return "is gone (deleted)"
    state = container_state(pod, container)
    if "terminated" in state:
        t = state["terminated"]
        reason = f" ({t['reason']})" if t.get("reason") else ""
        return f"exited with code {t.get('exitCode')}{reason}"
    waiting = state.get("waiting") or {}
    if waiting.get("reason") in HOPELESS:
        return f"cannot start: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Failed", "Succeeded"):
        return f"ended ({phase}: {(pod.get('status') or {}).get('reason') or 'no reason given'})"
    return None


def pending_reason(pod: dict[str, Any] | None, container: str = CONTAINER) -> str:
    """What a Pod that is not running yet waits for (the scheduler's or kubelet's words)."""
    if pod is None:
        return ""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"unscheduled: {cond.get('message') or cond.get('reason')}"
    waiting = container_state(pod, container).get("waiting") or {}
    if waiting:
        return f"{waiting.get('reason')}: {waiting.get('message', '')}".rstrip(": ")
    return f"phase {(pod.get('status') or {}).get('phase', 'unknown')}"


class PodServer(VLLMServer):
    """A vLLM server for one configuration, in a Pod of its own (module doc)."""

    LABEL = "the vLLM server Pod"

    def __init__(
        self,
        spec: Spec,
        backend: VLLMBackend,
        log_path: Path,
        api: KubeAPI,
        template: dict[str, Any],
        owner: dict[str, str],
    ) -> None:
        super().__init__(spec, backend, log_path)
        self.api = api
        self.template = template
        self.owner = owner  # the runner's Pod: name, uid
        self.port = SERVER_PORT
        self.name = pod_name(owner["name"], backend.name)
        self.pod_ip: str | None = None
        self.node: str | None = None
        self.version: str | None = None  # the vLLM version it reports (GET /version)
        (container,) = template["spec"]["containers"]
        self.image: str = backend.image or str(container.get("image") or "")
        self._gone: str | None = None  # how it ended, once known

    @property
    def base_url(self) -> str:
        return f"http://{self.pod_ip or '0.0.0.0'}:{self.port}"  # noqa: S104

    def egress(self) -> Egress:
        """Its Pod's address only: the server the runner created, not loopback."""
        return Egress([self.base_url], self.LABEL, "the runner's own server must not redirect")

    def argv(self) -> list[str]:
        address = ["--host", "0.0.0.0", "--port", str(self.port)]  # noqa: S104 (its own Pod)
        flags = serve_flags(self.spec, self.backend)
        return ["python", "-m", SERVER_MODULE, "--model", self.spec.model.id, *address, *flags]

    def manifest(self) -> dict[str, Any]:
        """The Pod to create: the portal's template, named, owned and given its command."""
        labels = {COMPONENT_LABEL: "server", BACKEND_LABEL: label_value(self.backend.name)}
        pod = owned_pod(self.template, self.name, self.owner, labels)
        (container,) = pod["spec"]["containers"]
        if self.backend.image:  # this configuration's own image (another vLLM version)
            container["image"] = self.backend.image
        container["command"] = self.argv()
        container["ports"] = [{"name": "http", "containerPort": self.port}]
        env = container.setdefault("env", [])
        env += [{"name": k, "value": v} for k, v in server_env(self.backend).items()]
        return pod

    def start(self) -> None:
        """Create the Pod, wait for it to run and answer /health; ServerError (the Pod
        deleted, its log kept) otherwise."""
        started = time.monotonic()
        deadline = started + self.backend.startup_timeout_s
        with open(self.log_path, "a") as log:
            log.write(f"$ {shlex.join(self.argv())}  # in Pod {self.name}\n")
        try:
            self.api.create_pod(self.manifest())
            self._wait_running(deadline)
            self._wait_healthy(deadline)
        except KubeError as exc:
            self.stop()
            raise ServerError(f"{self.LABEL} {self.name}: the Kubernetes API said {exc}") from None
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started

    def _failed(self, why: str) -> ServerError:
        from runners import procs

        self._save_log()
        return ServerError(
            f"{self.LABEL} {self.name} {why}. " + procs.log_section(self.log_path, self.log_tail())
        )

    def _wait_running(self, deadline: float) -> None:
        while True:
            pod = self.api.pod(self.name)
            why = why_not_running(pod)
            if why is not None:
                raise self._failed(f"{why} before it was ready")
            assert pod is not None
            status = pod.get("status") or {}
            if status.get("phase") == "Running" and status.get("podIP"):
                self.pod_ip = status["podIP"]
                self.node = (pod.get("spec") or {}).get("nodeName")
                return
            if time.monotonic() > deadline:
                raise self._failed(
                    f"was not running within startup_timeout_s={self.backend.startup_timeout_s}"
                    f" s ({pending_reason(pod)})"
                )
            time.sleep(POLL_S)

    def _wait_healthy(self, deadline: float) -> None:
        session = self.egress().session()
        while True:
            try:
                if session.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    self.version = self._served_version(session)
                    return
            except requests.RequestException:
                pass
            why = why_not_running(self.api.pod(self.name))
            if why is not None:
                raise self._failed(f"{why} before it was ready")
            if time.monotonic() > deadline:
                raise self._failed(
                    f"was not ready within startup_timeout_s={self.backend.startup_timeout_s} s "
                    "(raise it for large models)"
                )
            time.sleep(POLL_S)

    def _served_version(self, session: requests.Session) -> str | None:
        """The vLLM version the server reports (``GET /version``): with an image of its
        own it is not the runner's."""
        try:
            answer = session.get(f"{self.base_url}/version", timeout=5)
            version = answer.json().get("version") if answer.status_code == 200 else None
        except (requests.RequestException, ValueError, AttributeError):
            return None
        return str(version)[:64] if version else None

    @property
    def pid(self) -> int | None:
        return None

    @property
    def alive(self) -> bool:
        if self._gone is not None:
            return False
        try:
            why = why_not_running(self.api.pod(self.name))
        except KubeError:
            return True  # the API was briefly away: the next point finds out
        if why is not None:
            self._gone = why
            self._save_log()
        return why is None

    def ended(self) -> str:
        return self._gone or "is no longer running"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return self.api.pod_log(self.name, lines=lines).rstrip("\n")
        except KubeError:
            from runners import procs

            return procs.tail(self.log_path, lines)

    def _save_log(self) -> None:
        """The Pod's whole log into ``log_path`` (the runner's work directory), once."""
        if getattr(self, "_log_saved", False):
            return
        try:
            text = self.api.pod_log(self.name)
        except KubeError:
            return
        with open(self.log_path, "a") as log:
            log.write(text)
        self._log_saved = True

    def stop(self, grace_s: float | None = None) -> None:
        """Keep its log, delete the Pod, wait (bounded) until it is gone; safe twice."""
        grace = int(grace_s if grace_s is not None else 20)
        try:
            if self.api.pod(self.name) is None:
                return
            self._save_log()
            self.api.delete_pod(self.name, grace_s=grace)
            deadline = time.monotonic() + grace + 30
            while self.api.pod(self.name) is not None and time.monotonic() < deadline:
                time.sleep(POLL_S)
        except KubeError:
            pass  # the owner reference deletes it with the runner's Pod
        self._gone = self._gone or "was stopped"

    def placement(self) -> dict[str, Any]:
        """Where it ran, for each point's conditions and the run's environment."""
        return {
            "server_pod": self.name,
            "server_node": self.node,
            "server_pod_ip": self.pod_ip,
            "server_image": self.image,
            "server_vllm_version": self.version,
            "core_split": f"the server in Pod {self.name} on node {self.node or 'unknown'}; "
            "the client on the runner Pod's cores",
        }


def owned_pod(
    template: dict[str, Any], name: str, owner: dict[str, str], labels: dict[str, str]
) -> dict[str, Any]:
    """A Pod from the portal's ``template``: named, labelled, owned by the runner's Pod
    (the garbage collector deletes it with the runner), never restarted."""
    pod = copy.deepcopy(template)
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    meta = pod.setdefault("metadata", {})
    meta["name"] = name
    meta.setdefault("labels", {}).update(labels)
    meta["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": owner["name"], "uid": owner["uid"]}
    ]
    pod["spec"]["restartPolicy"] = "Never"
    return pod


def label_value(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", value)[:_DNS_LABEL_MAX].strip("-_.")


def server_for(spec: Spec, backend: VLLMBackend, log_path: Path) -> VLLMServer:
    """A ``PodServer`` where the portal asked for one (``SERVEBENCH_SERVER_POD``), else a
    local ``VLLMServer`` (a child of the runner)."""
    template = template_from_env()
    if template is None:
        if backend.image:
            raise ServerError(
                f"backend {backend.name!r} names an image ({backend.image}), which only a "
                "server in a Pod of its own can run (the Kubernetes executor with "
                "SERVEBENCH_K8S_SERVER_PLACEMENT=separate); here the server is the runner's "
                "child, in the runner's own image: remove image, or submit to such a portal"
            )
        return VLLMServer(spec, backend, log_path)
    owner = runner_owner(POD_ENV, "the server Pod is", ServerError)
    return PodServer(spec, backend, log_path, KubeAPI.in_cluster(), template, owner)
