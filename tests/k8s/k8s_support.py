"""Helpers for the Kubernetes tests: binaries, the control plane, and a stand-in kubelet.

A plain module (imported as ``k8s_support`` by the tests in this directory) so that test
modules can import helpers without going through a ``conftest`` module name, which every
test directory shares.

The control plane is real: etcd + kube-apiserver + kube-controller-manager v1.20.2 built
from Debian's source package by ``scripts/kube-binaries.sh`` (docs/development.md). There is no
scheduler and no kubelet: ``Kubelet`` patches Pod status the way a kubelet would, and the
real Job controller and garbage collector react to it.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
KUBE_DIR = Path(
    os.environ.get("SERVEBENCH_KUBE_DIR")
    or Path(os.environ.get("SERVEBENCH_CACHE") or Path.home() / ".cache" / "servebench") / "kube"
)
BIN = KUBE_DIR / "bin"
HOW = (
    "run `make kube` (scripts/kube-binaries.sh builds kube-apiserver and "
    "kube-controller-manager 1.20.2 from Debian's source and fetches helm and kubectl into "
    "~/.cache/servebench/kube/bin, as root, once)"
)
CONTROLLERS = (
    "job,garbagecollector,ttl-after-finished,namespace,serviceaccount,serviceaccount-token"
)
# Where test_chart_install.py installs the chart; chosen before the API server starts so
# that a static token can authenticate as the release's ServiceAccount.
CHART_RELEASE = "servebench"
CHART_NAMESPACE = f"sb-chart-{uuid.uuid4().hex[:6]}"
# Where test_server_pod.py plays a runner Pod: a static token authenticates as the runner
# ServiceAccount of k8s/rbac.yaml there, so the test checks what that Role really allows.
RUNNER_NAMESPACE = f"sb-runner-{uuid.uuid4().hex[:6]}"
RUNNER_ACCOUNT = "servebench-runner"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def tool(name: str) -> str | None:
    """The cached binary, else one on PATH, else None."""
    cached = BIN / name
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    return shutil.which(name)


def run_tool(
    argv: list[str], timeout: float = 120, check: bool = True, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """Run helm or kubectl; fail the test with its output when it fails."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        pytest.fail(
            f"`{' '.join(argv[:5])} ...` exited {result.returncode}:\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}",
            pytrace=False,
        )
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# GPU feature discovery's label value for an H100 SXM (nvidia.com/gpu.product).
GPU_TYPE = "NVIDIA-H100-80GB-HBM3"


def gpu_spec(**resources: Any) -> dict[str, Any]:
    """A small valid spec asking for one GPU of a type (tests/portal's tiny spec, on a GPU)."""
    return {
        "name": "tiny on k8s",
        "model": {"id": "org/tiny-model", "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 8, "num_warmups": 0},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1, 4]}],
        "backends": [{"kind": "hf-sequential", "num_prompts": 4}, {"kind": "vllm"}],
        "resources": {"gpu_count": 1, "gpu_type": GPU_TYPE, "timeout_minutes": 10, **resources},
    }


# --------------------------------------------------------------------------- control plane


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def write_keys(directory: Path) -> None:
    """A self-signed serving certificate for 127.0.0.1 and a service-account key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "servebench-test-apiserver")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    (directory / "serving.key").write_bytes(_pem_key(key))
    (directory / "serving.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "sa.key").write_bytes(_pem_key(sa))
    (directory / "sa.pub").write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def kubeconfig_text(server: str, ca: Path, token: str, namespace: str = "default") -> str:
    return f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {{server: "{server}", certificate-authority: "{ca}"}}
users:
- name: test
  user: {{token: "{token}"}}
contexts:
- name: test
  context: {{cluster: test, user: test, namespace: "{namespace}"}}
current-context: test
"""


@dataclass
class ControlPlane:
    dir: Path
    server: str
    token: str
    ca: Path
    kubeconfig: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    started_in: float = 0.0

    def log(self, name: str, lines: int = 30) -> str:
        path = self.dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def get(self, path: str, timeout: float = 3) -> tuple[int, str]:
        """GET ``path`` on the API server with the test token: (status, body); 0 if down."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        headers = {"Authorization": f"Bearer {self.token}"}
        req = urllib.request.Request(self.server + path, headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:  # noqa: S310
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            return 0, str(exc)

    def api_client(self) -> Any:
        """A client for the tests' own calls (the executor builds its own)."""
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        return client.ApiClient(cfg)

    def kubeconfig_for(
        self, path: Path, server: str = "", namespace: str = "default", token: str = ""
    ) -> str:
        """A kubeconfig for this cluster with another server address or another token."""
        text = kubeconfig_text(server or self.server, self.ca, token or self.token, namespace)
        path.write_text(text)
        return str(path)

    # ----------------------------------------------------------------- processes

    def _start(self, name: str, argv: list[str]) -> None:
        with (self.dir / f"{name}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.dir,
            )  # fmt: skip

    def _await(self, name: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{name} was not ready after {timeout:.0f} s:\n{self.log(name)}")

    def stop(self) -> None:
        """SIGTERM each process group we started (then SIGKILL), newest first."""
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def start_control_plane(
    binaries: dict[str, str], users: dict[str, tuple[str, list[str]]] | None = None
) -> ControlPlane:
    """Start etcd, kube-apiserver and kube-controller-manager on free ports; raises
    RuntimeError (with the failing process's log) if one does not come up.

    Authorization is RBAC, as in a real cluster: the tests' own token is in
    ``system:masters`` (allowed everything); ``users`` maps a name to (user name, groups)
    for more static tokens (``ControlPlane.tokens[name]``), e.g. one that authenticates as
    a ServiceAccount so a test can check what a Role really allows."""
    began = time.monotonic()
    # etcd fsyncs every write: a memory-backed directory keeps that cheap when there is one.
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    directory = Path(tempfile.mkdtemp(prefix="servebench-kube-", dir=base))
    token = uuid.uuid4().hex
    lines = [f"{token},servebench-test,1,system:masters"]
    tokens = {}
    for n, (name, (user, groups)) in enumerate((users or {}).items(), start=2):
        tokens[name] = uuid.uuid4().hex
        lines.append(f'{tokens[name]},{user},{n},"{",".join(groups)}"')
    (directory / "tokens.csv").write_text("\n".join(lines) + "\n")
    write_keys(directory)
    api_port, etcd_port, peer_port = free_port(), free_port(), free_port()
    server = f"https://127.0.0.1:{api_port}"
    cp = ControlPlane(directory, server, token, directory / "serving.crt", directory / "kubeconfig")
    cp.tokens = tokens
    cp.kubeconfig.write_text(kubeconfig_text(server, cp.ca, token))
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    try:
        cp._start("etcd", [
            binaries["etcd"], "--name", "test", "--data-dir", str(directory / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"test={peer_url}", "--log-level", "warn",
        ])  # fmt: skip

        def etcd_ready() -> bool:
            try:
                with urllib.request.urlopen(f"{etcd_url}/health", timeout=1) as resp:  # noqa: S310
                    return b"true" in resp.read()
            except OSError:
                return False

        cp._await("etcd", etcd_ready, 30)
        cp._start("kube-apiserver", [
            binaries["kube-apiserver"],
            "--etcd-servers", etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(api_port),
            "--tls-cert-file", str(directory / "serving.crt"),
            "--tls-private-key-file", str(directory / "serving.key"),
            "--cert-dir", str(directory / "certs"),
            "--token-auth-file", str(directory / "tokens.csv"),
            "--service-account-key-file", str(directory / "sa.pub"),
            "--service-account-signing-key-file", str(directory / "sa.key"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--authorization-mode", "RBAC",
            "--feature-gates", "TTLAfterFinished=true",
            "--service-cluster-ip-range", "10.96.0.0/16",
            "--profiling=false", "--v", "1",
        ])  # fmt: skip
        cp._await("kube-apiserver", lambda: cp.get("/readyz")[0] == 200, 90)
        cp._start("kube-controller-manager", [
            binaries["kube-controller-manager"],
            "--kubeconfig", str(cp.kubeconfig),
            "--controllers", CONTROLLERS,
            "--service-account-private-key-file", str(directory / "sa.key"),
            "--root-ca-file", str(cp.ca),
            "--feature-gates", "TTLAfterFinished=true",
            "--leader-elect=false", "--port", "0", "--secure-port", "0",
            "--v", "1",
        ])  # fmt: skip
        cp._await(
            "kube-controller-manager",
            lambda: cp.get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            60,
        )
    except BaseException:
        cp.stop()
        raise
    cp.started_in = time.monotonic() - began
    return cp


def create_namespace(api_client: Any, name: str) -> str:
    """Create ``name`` and wait for its default service account (Pods need it)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def sa_ready() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
            return True
        except ApiException:
            return False

    wait_for(sa_ready, 30, f"the default service account of namespace {name}")
    return name


def secret_value(api_client: Any, namespace: str, name: str, key: str) -> str:
    from kubernetes import client

    secret = client.CoreV1Api(api_client).read_namespaced_secret(name, namespace)
    return base64.b64decode(secret.data[key]).decode()


# --------------------------------------------------------------------------- the kubelet


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Kubelet:
    """Plays the kubelet (and the scheduler's condition) by patching a Pod's status."""

    api_client: Any
    namespace: str

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    @property
    def batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self.api_client)

    def pod_of(self, job: str, timeout: float = 90, namespace: str | None = None) -> Any:
        """The Pod the real Job controller created for Job ``job``."""
        ns = namespace or self.namespace

        def find() -> Any:
            pods = self.core.list_namespaced_pod(ns, label_selector=f"job-name={job}")
            return pods.items[0] if pods.items else None

        return wait_for(find, timeout, f"the Job controller to create a Pod for {job}")

    def _patch(self, pod: Any, status: dict[str, Any]) -> Any:
        return self.core.patch_namespaced_pod_status(
            pod.metadata.name, pod.metadata.namespace, {"status": status}
        )

    @staticmethod
    def _container(pod: Any, state: dict[str, Any], ready: bool = False) -> dict[str, Any]:
        image = pod.spec.containers[0].image
        started = "waiting" not in state
        return {
            "name": pod.spec.containers[0].name,
            "image": image,
            "imageID": f"docker-pullable://{image.split(':')[0]}@sha256:{'0' * 64}"
            if started
            else "",
            "ready": ready,
            "restartCount": 0,
            "started": "running" in state,
            "state": state,
        }

    def running(self, pod: Any) -> Any:
        now = _now()
        return self._patch(pod, {
            "phase": "Running",
            "startTime": now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
            ],
            "containerStatuses": [
                self._container(pod, {"running": {"startedAt": now}}, ready=True)
            ],
        })  # fmt: skip

    def terminated(self, pod: Any, exit_code: int, reason: str = "Error", message: str = "") -> Any:
        now = _now()
        state = {
            "terminated": {
                "exitCode": exit_code, "reason": reason, "message": message,
                "startedAt": now, "finishedAt": now,
            }
        }  # fmt: skip
        return self._patch(pod, {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "startTime": now,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "False", "lastTransitionTime": now},
            ],
            "containerStatuses": [self._container(pod, state)],
        })  # fmt: skip

    def waiting(self, pod: Any, reason: str, message: str) -> Any:
        now = _now()
        return self._patch(pod, {
            "phase": "Pending",
            "startTime": now,
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [
                self._container(pod, {"waiting": {"reason": reason, "message": message}})
            ],
        })  # fmt: skip

    def unschedulable(self, pod: Any, message: str) -> Any:
        return self._patch(pod, {
            "phase": "Pending",
            "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": message, "lastTransitionTime": _now(),
            }],
        })  # fmt: skip

    def job_condition(self, job: str, timeout: float = 90, namespace: str | None = None) -> Any:
        """Wait for the real Job controller to mark ``job`` Complete or Failed."""
        ns = namespace or self.namespace

        def finished() -> Any:
            status = self.batch.read_namespaced_job(job, ns).status
            for cond in status.conditions or []:
                if cond.type in ("Complete", "Failed") and cond.status == "True":
                    return cond
            return None

        return wait_for(finished, timeout, f"the Job controller to finish Job {job}")


# --------------------------------------------------------------------------- manifests

CHART = REPO / "charts" / "servebench"
KUSTOMIZE = REPO / "k8s"
VALUES_EVERYTHING = Path(__file__).resolve().parent / "data" / "values-everything.yaml"
SCHEMA_VERSION = "1.37.0"  # kubernetes-validate's newest schemas


def load_documents(text: str) -> list[dict[str, Any]]:
    import yaml

    return [doc for doc in yaml.safe_load_all(text) if doc]


def render_chart(
    helm: str, *args: str, release: str = "servebench", namespace: str = "servebench"
) -> list[dict[str, Any]]:
    """``helm template`` the chart; the documents it prints."""
    out = run_tool([helm, "template", release, str(CHART), "--namespace", namespace, *args])
    return load_documents(out.stdout)


def render_kustomize(kubectl: str, directory: Path = KUSTOMIZE) -> list[dict[str, Any]]:
    return load_documents(run_tool([kubectl, "kustomize", str(directory)]).stdout)


def validation_errors(docs: list[dict[str, Any]], version: str = SCHEMA_VERSION) -> list[str]:
    """What ``kubernetes-validate -k VERSION --strict`` finds wrong; a kind without a
    schema is an error too (we only use built-in kinds)."""
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

    errors = []
    for doc in docs:
        what = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{what}: {path}: {exc.message}")
        except SchemaNotFoundError as exc:
            errors.append(f"{what}: {exc.message}")
    return errors


def index(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}
