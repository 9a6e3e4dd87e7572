"""Each vLLM server in a Pod of its own, apart from the runner (issue 26): the Job the
portal builds, and the runner's server Pod against the real API server, with nothing but
k8s/rbac.yaml's runner Role (RBAC is on), the real Job controller and garbage collector.

No kubelet here: ``Kubelet`` plays it (status patches), and a tiny HTTP answer on loopback
stands in for the server's ``/health`` at the Pod IP the test gives the Pod.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_support import (
    REPO,
    RUNNER_ACCOUNT,
    RUNNER_NAMESPACE,
    ControlPlane,
    Kubelet,
    create_namespace,
    gpu_spec,
    wait_for,
)
from kubernetes import client
from kubernetes.client.rest import ApiException

from portal.dispatch import kubejob
from runners import clientpods, kube
from runners import multiclient as mc
from runners.spec import parse_spec
from runners.vllm_server import ServerError

pytestmark = pytest.mark.timeout(180)

IMAGE = "registry.example.com/servebench-runner:test"
RUNTIME = "server-pod-test-nvidia"  # cluster-scoped: a name no other test module uses
CFG = kubejob.RunnerConfig(
    image=IMAGE,
    service_account=RUNNER_ACCOUNT,
    runtime_class=RUNTIME,
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    hf_cache_pvc="hf-cache",
    runner_api_url="https://10.0.0.1:6443",
)


def vllm_spec(**resources: Any) -> dict[str, Any]:
    spec = gpu_spec(cpu="8", memory="48Gi", gpu_count=2, **resources)
    spec["backends"] = [{"kind": "vllm", "name": "seqs4", "max_num_seqs": 4}]
    return spec


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


# --------------------------------------------------------------------------- the Job


def test_a_vllm_run_gets_a_runner_without_gpus_and_a_server_pod_with_them():
    job = kubejob.to_manifest(kubejob.build_job("apart01", vllm_spec(), "https://x/r", CFG))
    pod = job["spec"]["template"]["spec"]
    (runner,) = pod["containers"]
    assert runner["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi"},
        "limits": {"memory": "8Gi"},
    }
    assert "runtimeClassName" not in pod
    # Its token, only to manage its server Pods (the runner Role); its identity.
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == RUNNER_ACCOUNT
    env = env_of(runner)
    assert env["SERVEBENCH_POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["SERVEBENCH_KUBE_API_URL"] == "https://10.0.0.1:6443"
    assert job["metadata"]["annotations"][kubejob.PLACEMENT_ANNOTATION].startswith("separate: ")

    server = json.loads(env[kubejob.SERVER_POD_ENV])
    (container,) = server["spec"]["containers"]
    assert container["name"] == "server" and container["image"] == IMAGE
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "48Gi"},
        "limits": {"memory": "48Gi", "nvidia.com/gpu": "2"},
    }
    assert server["spec"]["runtimeClassName"] == RUNTIME
    assert server["spec"]["tolerations"] == CFG.tolerations
    assert server["spec"]["nodeSelector"] == pod["nodeSelector"]  # the same GPU type
    assert server["spec"]["automountServiceAccountToken"] is False
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"dshm": "/dev/shm", "hf-cache": CFG.hf_home}
    assert "SERVEBENCH_RUN_TOKEN" not in env_of(container)  # the server never sees it
    assert server["metadata"]["labels"]["app.kubernetes.io/component"] == "server"


@pytest.mark.parametrize(
    ("backends", "cfg", "why"),
    [
        ([{"kind": "hf-sequential"}, {"kind": "vllm"}], CFG, "hf-sequential runs inside"),
        ([{"kind": "vllm"}], kubejob.RunnerConfig(image=IMAGE, server_placement="same-pod"), ""),
    ],
    ids=["an-hf-baseline-needs-the-gpus", "the-setting"],
)
def test_a_run_keeps_its_server_in_the_runner_pod_where_it_must_or_is_told(backends, cfg, why):
    spec = vllm_spec()
    spec["backends"] = backends
    job = kubejob.to_manifest(kubejob.build_job("samepod01", spec, "https://x/r", cfg))
    pod = job["spec"]["template"]["spec"]
    (runner,) = pod["containers"]
    assert runner["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert kubejob.SERVER_POD_ENV not in env_of(runner)
    assert pod["automountServiceAccountToken"] is False
    said = job["metadata"]["annotations"][kubejob.PLACEMENT_ANNOTATION]
    assert said.startswith("same-pod: ") and why in said


# --------------------------------------------------------------------------- real API server


SERVED_VERSION = "0.33.1"  # what the stand-in says it is (GET /version)


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/version":
            body = json.dumps({"version": SERVED_VERSION}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health() -> Iterator[int]:
    """``/health`` answering 200 on loopback: the server's port, as the Pod IP's stand-in."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def runner_namespace(kube_api: Any) -> Iterator[str]:
    """RUNNER_NAMESPACE with k8s/rbac.yaml's runner ServiceAccount, Role and binding, and
    the RuntimeClass the settings name (the API server refuses a Pod naming a missing one)."""
    create_namespace(kube_api, RUNNER_NAMESPACE)
    node = client.NodeV1Api(kube_api)
    node.create_runtime_class(
        client.V1RuntimeClass(metadata=client.V1ObjectMeta(name=RUNTIME), handler="nvidia")
    )
    docs = list(yaml.safe_load_all((REPO / "k8s" / "rbac.yaml").read_text()))
    core, rbac = client.CoreV1Api(kube_api), client.RbacAuthorizationV1Api(kube_api)
    for doc in docs:
        name = doc["metadata"]["name"]
        if doc["kind"] == "ServiceAccount" and name == RUNNER_ACCOUNT:
            core.create_namespaced_service_account(RUNNER_NAMESPACE, doc)
        elif doc["kind"] == "Role" and name == "servebench-runner-servers":
            rbac.create_namespaced_role(RUNNER_NAMESPACE, doc)
        elif doc["kind"] == "RoleBinding" and name == "servebench-runner-servers":
            for subject in doc["subjects"]:
                subject["namespace"] = RUNNER_NAMESPACE
            rbac.create_namespaced_role_binding(RUNNER_NAMESPACE, doc)
    yield RUNNER_NAMESPACE
    node.delete_runtime_class(RUNTIME)


@pytest.fixture
def runner_pod(kube_api: Any, runner_namespace: str, request: Any) -> Iterator[Any]:
    """The runner Pod the real Job controller made from the portal's Job (the owner)."""
    public_id = f"apart{abs(hash(request.node.name)) % 10**6:06d}"
    job = kubejob.build_job(public_id, vllm_spec(), "https://x/r", CFG)
    batch = client.BatchV1Api(kube_api)
    batch.create_namespaced_job(runner_namespace, job)
    pod = Kubelet(kube_api, runner_namespace).pod_of(job.metadata.name)
    yield pod
    with contextlib.suppress(ApiException):
        batch.delete_namespaced_job(
            job.metadata.name, runner_namespace, propagation_policy="Foreground"
        )


def server_for(
    cp: ControlPlane,
    runner_pod: Any,
    tmp_path: Path,
    port: int,
    timeout_s: int = 30,
    image: str | None = None,
) -> kube.PodServer:
    """The runner's PodServer, as its Pod would make it: the runner's token, the portal's
    template, the runner Pod as owner; its port the health stand-in's."""
    (container,) = runner_pod.spec.containers
    template = json.loads(next(e.value for e in container.env if e.name == kube.POD_ENV))
    spec = parse_spec(vllm_spec())
    backend = spec.vllm_backends[0].model_copy(
        update={"startup_timeout_s": timeout_s, "image": image}
    )
    api = kube.KubeAPI(cp.server, cp.tokens["runner"], RUNNER_NAMESPACE, str(cp.ca))
    owner = {"name": runner_pod.metadata.name, "uid": runner_pod.metadata.uid}
    server = kube.PodServer(spec, backend, tmp_path / "server.log", api, template, owner)
    server.port = port
    return server


def start_in_thread(server: kube.PodServer) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            server.start()
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    return thread, errors


def created(core: Any, name: str, errors: list[BaseException] | None = None) -> Any:
    def find() -> Any:
        assert not errors, errors  # the runner gave up: why
        try:
            return core.read_namespaced_pod(name, RUNNER_NAMESPACE)
        except ApiException:
            return None

    return wait_for(find, 30, f"the server Pod {name}")


def gone(core: Any, name: str) -> bool:
    try:
        core.read_namespaced_pod(name, RUNNER_NAMESPACE)
    except ApiException as exc:
        return exc.status == 404
    return False


def test_the_runner_creates_its_server_pod_reaches_it_and_deletes_it(
    control_plane, kube_api, runner_pod, health, tmp_path
):
    core = client.CoreV1Api(kube_api)
    newer = "registry.example.com/servebench-runner:vllm-0.33"  # this configuration's own
    server = server_for(control_plane, runner_pod, tmp_path, health, image=newer)
    thread, errors = start_in_thread(server)
    pod = created(core, server.name, errors)
    # What the runner made of the template: owned by its Pod, its command, no token.
    assert server.name == f"{runner_pod.metadata.name}-seqs4"
    (ref,) = pod.metadata.owner_references
    assert (ref.kind, ref.name, ref.uid) == (
        "Pod",
        runner_pod.metadata.name,
        runner_pod.metadata.uid,
    )
    assert pod.metadata.labels["servebench.dev/backend"] == "seqs4"
    assert pod.metadata.labels["app.kubernetes.io/component"] == "server"
    (container,) = pod.spec.containers
    assert container.image == newer  # the template's (the runner's) image replaced
    assert container.command[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--max-num-seqs" in container.command and "0.0.0.0" in container.command  # noqa: S104
    assert container.resources.limits == {"memory": "48Gi", "nvidia.com/gpu": "2"}
    assert pod.spec.runtime_class_name == RUNTIME and pod.spec.restart_policy == "Never"
    assert pod.spec.automount_service_account_token is False

    kubelet = Kubelet(kube_api, RUNNER_NAMESPACE)
    kubelet.running(pod)
    core.patch_namespaced_pod_status(
        server.name, RUNNER_NAMESPACE, {"status": {"podIP": "127.0.0.1"}}
    )
    thread.join(30)
    assert not errors, errors
    assert server.alive and server.base_url == f"http://127.0.0.1:{health}"
    placed = server.placement()
    assert placed["server_pod"] == server.name and placed["server_pod_ip"] == "127.0.0.1"
    # Which image it ran and the vLLM version the server itself reported.
    assert (placed["server_image"], placed["server_vllm_version"]) == (newer, SERVED_VERSION)

    server.stop()
    assert gone(core, server.name) and not server.alive


def test_a_server_pod_that_cannot_start_fails_with_its_reason_and_is_deleted(
    control_plane, kube_api, runner_pod, health, tmp_path
):
    core = client.CoreV1Api(kube_api)
    server = server_for(control_plane, runner_pod, tmp_path, health)
    thread, errors = start_in_thread(server)
    pod = created(core, server.name, errors)
    Kubelet(kube_api, RUNNER_NAMESPACE).waiting(
        pod, "ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'
    )
    thread.join(30)
    (error,) = errors
    assert isinstance(error, ServerError)
    assert f"the vLLM server Pod {server.name} cannot start: ImagePullBackOff" in str(error)
    assert IMAGE in str(error)
    assert gone(core, server.name)  # nothing left holding a GPU


def test_a_server_pod_not_running_before_its_deadline_says_what_it_waits_for(
    control_plane, kube_api, runner_pod, health, tmp_path
):
    core = client.CoreV1Api(kube_api)
    server = server_for(control_plane, runner_pod, tmp_path, health, timeout_s=6)
    thread, errors = start_in_thread(server)
    pod = created(core, server.name, errors)
    Kubelet(kube_api, RUNNER_NAMESPACE).unschedulable(
        pod, "0/1 nodes: 1 Insufficient nvidia.com/gpu."
    )
    thread.join(30)
    (error,) = errors
    assert "was not running within startup_timeout_s=6 s" in str(error)
    assert "Insufficient nvidia.com/gpu" in str(error)
    assert gone(core, server.name)


def test_the_server_pod_goes_with_the_runner_pod_and_the_runner_may_do_nothing_else(
    control_plane, kube_api, runner_pod, health, tmp_path
):
    core = client.CoreV1Api(kube_api)
    server = server_for(control_plane, runner_pod, tmp_path, health)
    server.api.create_pod(server.manifest())  # as if the runner died right after
    created(core, server.name)
    # The runner Role: Pods and their logs in its namespace, nothing else.
    for method, path in (("GET", "secrets"), ("POST", "services"), ("GET", "configmaps")):
        with pytest.raises(kube.KubeError) as err:
            server.api.call(method, path, {} if method == "POST" else None)
        assert err.value.status == 403
    other = kube.KubeAPI(control_plane.server, server.api.token, "default", str(control_plane.ca))
    with pytest.raises(kube.KubeError) as err:
        other.pod("anything")
    assert err.value.status == 403
    # The Job deleted (cancel, deadline, TTL): its Pod goes, and the garbage collector
    # deletes the server Pod it owned.
    core.delete_namespaced_pod(runner_pod.metadata.name, RUNNER_NAMESPACE, grace_period_seconds=0)
    wait_for(lambda: gone(core, server.name), 60, "the garbage collector to delete the server Pod")


# --------------------------------------------------------------------------- the runner's side


class DroppingProxy:
    """A TCP relay to the API server that cuts the first ``drops`` connections before a
    byte is answered (an API server restarting, a busy load balancer), then relays."""

    def __init__(self, upstream: str, drops: int) -> None:
        self.upstream = urllib.parse.urlsplit(upstream)
        self.drops = drops
        self.dropped = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.dropped < self.drops:
                self.dropped += 1
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()  # a reset
                continue
            up = socket.create_connection((self.upstream.hostname, self.upstream.port))
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


def test_the_runner_rides_out_dropped_api_calls_and_finds_the_pod_its_lost_create_made(
    control_plane, kube_api, runner_pod, health, tmp_path, capfd
):
    """A CI run once lost a whole configuration to one timed-out POST pods: calls the API
    server did not answer are tried again, and a create whose answer was lost (the Pod
    made, the runner not told) is not a conflict with itself."""
    core = client.CoreV1Api(kube_api)
    server = server_for(control_plane, runner_pod, tmp_path, health)
    made = server.api.create_pod(server.manifest())
    again = server.api.create_pod(server.manifest())  # the retry of a create already made
    assert again["metadata"]["uid"] == made["metadata"]["uid"]
    # A Pod of that name some other owner made is not taken for its own.
    stranger = server.manifest()
    stranger["metadata"]["ownerReferences"][0]["uid"] = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(kube.KubeError) as err:
        server.api.create_pod(stranger)
    assert err.value.status == 409

    proxy = DroppingProxy(control_plane.server, drops=2)
    try:
        api = kube.KubeAPI(proxy.url, server.api.token, RUNNER_NAMESPACE, str(control_plane.ca))
        api.retry_s = 20
        assert api.pod(server.name)["metadata"]["uid"] == made["metadata"]["uid"]
        assert proxy.dropped == 2
        # Once it has answered, an outage longer than retry_s is ridden out (a CI run lost
        # a multi-client point to a starved API server): three resets take 3.5 s of backoff.
        api.retry_s, api.outage_s = 1, 30
        proxy.drops = proxy.dropped + 3
        assert api.pod(server.name)["metadata"]["uid"] == made["metadata"]["uid"]
        assert proxy.dropped == 5
        assert f"kube: GET pods/{server.name} answered after 4 tries over" in capfd.readouterr().err
        # An outage past outage_s: the error says so, how many tries and for how long.
        proxy.drops = 10**6
        api.outage_s = 2
        with pytest.raises(kube.KubeError) as err:
            api.pod(server.name)
        assert err.value.status == 0 and "did not answer" in str(err.value)
        assert "tries over" in str(err.value) and proxy.dropped >= 7
        # An API server that never answered this client (a wrong address) fails fast:
        # retry_s, however long an outage would be ridden out.
        fresh = kube.KubeAPI(proxy.url, server.api.token, RUNNER_NAMESPACE, str(control_plane.ca))
        fresh.retry_s, fresh.outage_s = 2, 3600
        began = time.monotonic()
        with pytest.raises(kube.KubeError) as err:
            fresh.pod(server.name)
        assert "tries over" in str(err.value) and time.monotonic() - began < 60
    finally:
        proxy.close()
    # A refusal is not retried: the Role does not allow secrets.
    with pytest.raises(kube.KubeError) as err:
        server.api.call("GET", "secrets")
    assert err.value.status == 403 and "tries" not in str(err.value)
    server.stop()
    assert gone(core, server.name)


def test_a_server_pod_is_named_after_the_runner_pod_as_a_dns_label():
    assert kube.pod_name("servebench-run-abc-x7k2p", "vllm") == "servebench-run-abc-x7k2p-vllm"
    long = kube.pod_name("servebench-run-" + "a" * 40 + "-x7k2p", "max_num_seqs=16.prefix")
    assert len(long) == 63 and long.rstrip("0123456789abcdef") != long
    assert long == kube.pod_name("servebench-run-" + "a" * 40 + "-x7k2p", "max_num_seqs=16.prefix")
    assert kube.pod_name("r", "A_b") == "r-a-b"


def test_without_a_pod_template_the_server_is_the_runners_child(tmp_path, monkeypatch):
    monkeypatch.delenv(kube.POD_ENV, raising=False)
    spec = parse_spec(vllm_spec())
    server = kube.server_for(spec, spec.vllm_backends[0], tmp_path / "s.log")
    assert type(server).__name__ == "VLLMServer"
    # A configuration with an image of its own cannot be the runner's child.
    imaged = spec.vllm_backends[0].model_copy(update={"image": "r.example.com/runner:vllm-1"})
    with pytest.raises(ServerError, match=r"names an image .* only a server in a Pod of its own"):
        kube.server_for(spec, imaged, tmp_path / "s.log")


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("{not json", "SERVEBENCH_SERVER_POD is not JSON"),
        ('{"spec": {"containers": [{"name": "runner"}]}}', "one container named 'server'"),
    ],
)
def test_a_bad_pod_template_is_refused_naming_the_variable(value, said):
    with pytest.raises(ServerError, match=said):
        kube.template_from_env({kube.POD_ENV: value})


def test_what_a_pod_waits_for_and_why_it_will_not_serve_are_said_in_its_own_words():
    waiting = {"status": {"phase": "Pending", "containerStatuses": [
        {"name": "server", "state": {"waiting": {"reason": "ErrImagePull", "message": "no"}}}
    ]}}  # fmt: skip
    assert kube.why_not_running(waiting) == "cannot start: ErrImagePull: no"
    oom = {"status": {"phase": "Failed", "containerStatuses": [
        {"name": "server", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    ]}}  # fmt: skip
    assert kube.why_not_running(oom) == "exited with code 137 (OOMKilled)"
    assert kube.why_not_running(None) == "is gone (deleted)"
    creating = {"status": {"phase": "Pending", "containerStatuses": [
        {"name": "server", "state": {"waiting": {"reason": "ContainerCreating"}}}
    ]}}  # fmt: skip
    assert kube.why_not_running(creating) is None
    assert kube.pending_reason(creating) == "ContainerCreating"


# --------------------------------------------------------------------------- client Pods


def clients_spec(clients: Any = 3, backends: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec = vllm_spec()
    spec["workload"]["clients"] = clients
    if backends is not None:
        spec["backends"] = backends
    return spec


def test_a_point_with_several_clients_gets_a_pod_template_for_each_load_generator():
    cfg = dataclasses.replace(CFG, loadgen_cpu_request="1500m", loadgen_memory_request="3Gi")
    job = kubejob.to_manifest(kubejob.build_job("lg01", clients_spec(), "https://x/r", cfg))
    pod = job["spec"]["template"]["spec"]
    (runner,) = pod["containers"]
    env = env_of(runner)
    assert env["SERVEBENCH_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert pod["automountServiceAccountToken"] is True
    template = json.loads(env[kubejob.CLIENT_POD_ENV])
    (container,) = template["spec"]["containers"]
    assert container["name"] == "client" and container["image"] == IMAGE
    # The load generator's own CPU and memory; no GPU, no runtime class, no token.
    assert container["resources"] == {
        "requests": {"cpu": "1500m", "memory": "3Gi"},
        "limits": {"memory": "3Gi"},
    }
    assert "runtimeClassName" not in template["spec"]
    assert template["spec"]["automountServiceAccountToken"] is False
    assert "SERVEBENCH_RUN_TOKEN" not in env_of(container)
    # The tokenizer from the model cache, and the runner's own placement rules.
    assert {m["name"] for m in container["volumeMounts"]} == {"hf-cache"}
    assert template["spec"]["tolerations"] == CFG.tolerations
    assert clientpods.template_from_env({clientpods.CLIENT_POD_ENV: env[kubejob.CLIENT_POD_ENV]})


@pytest.mark.parametrize(
    ("clients", "backends", "cfg", "pods"),
    [
        (1, None, CFG, False),
        ("auto", None, CFG, True),
        (2, [{"kind": "endpoint", "url": "http://gw.example.com:8000"}], CFG, True),
        (2, [{"kind": "hf-sequential"}, {"kind": "vllm"}], CFG, False),
        (2, None, kubejob.RunnerConfig(image=IMAGE, server_placement="same-pod"), False),
    ],
    ids=["one-client", "auto", "endpoints-only", "an-hf-baseline", "same-pod-setting"],
)
def test_load_generators_get_pods_only_where_the_runner_may_make_them(clients, backends, cfg, pods):
    job = kubejob.to_manifest(
        kubejob.build_job("lg02", clients_spec(clients, backends), "https://x/r", cfg)
    )
    pod = job["spec"]["template"]["spec"]
    (runner,) = pod["containers"]
    assert (kubejob.CLIENT_POD_ENV in env_of(runner)) is pods
    if pods:
        assert pod["automountServiceAccountToken"] is True


def test_client_pods_are_the_runners_and_a_failed_one_fails_the_point_and_all_go(
    control_plane, kube_api, runner_pod, tmp_path
):
    """PodClients against the real API server with the runner Role: the Pods it creates
    (owned by the runner's Pod, the load generator's command, no GPU), a client that
    exits 2 failing the point with its reason, and every client Pod deleted after."""
    job = kubejob.to_manifest(kubejob.build_job("lg03", clients_spec(2), "https://x/r", CFG))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    template = json.loads(env_of(container)[kubejob.CLIENT_POD_ENV])
    api = kube.KubeAPI(control_plane.server, control_plane.tokens["runner"], RUNNER_NAMESPACE,
                       str(control_plane.ca))  # fmt: skip
    owner = {"name": runner_pod.metadata.name, "uid": runner_pod.metadata.uid}
    launch = clientpods.PodClients(api, template, owner, "127.0.0.1")
    group = [
        mc.Client(
            index=i,
            argv=[
                "/venv/bin/python",
                "-m",
                "runners.bench_client",
                "--result-dir",
                "/w",
                "--result-filename",
                f"seqs4.c{i}.json",
            ],
            result=tmp_path / f"seqs4.c{i}.json",
            report=tmp_path / f"seqs4.c{i}.fields.json",
            log=tmp_path / f"seqs4.c{i}.client.log",
            cores=[],
        )
        for i in range(2)
    ]
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(launch.run(group, "seqs4")))
    thread.start()
    core = client.CoreV1Api(kube_api)

    def both() -> list[Any] | None:
        selector = "app.kubernetes.io/component=loadgen"
        pods = core.list_namespaced_pod(RUNNER_NAMESPACE, label_selector=selector).items
        return pods if len(pods) == 2 else None

    pods = sorted(wait_for(both, 30, "two client Pods"), key=lambda p: p.metadata.name)
    for i, pod in enumerate(pods):
        (ref,) = pod.metadata.owner_references
        assert (ref.kind, ref.uid) == ("Pod", runner_pod.metadata.uid)
        assert pod.metadata.labels["servebench.dev/client-index"] == str(i)
        (c,) = pod.spec.containers
        assert c.command[:4] == ["python", "-m", "runners.podclient", "--rendezvous"]
        assert c.command[c.command.index("--") + 1 :][:3] == [
            "python", "-m", "runners.bench_client"
        ]  # fmt: skip
        assert "nvidia.com/gpu" not in (c.resources.limits or {})
        assert pod.spec.restart_policy == "Never"
    kubelet = Kubelet(kube_api, RUNNER_NAMESPACE)
    kubelet.running(pods[0])
    kubelet.terminated(pods[1], 2)
    thread.join(90)
    assert not thread.is_alive()
    ((code, bad),) = outcome
    assert (code, bad.index) == (2, 1)
    assert f"client Pod {pods[1].metadata.name} exited with code 2" in group[1].log.read_text()
    assert all(gone(core, p.metadata.name) for p in pods)
