"""A real one-node Kubernetes cluster for the end-to-end test, from cached binaries.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler (the control plane), and a
node: containerd (Debian's) running Pods through runc, and the kubelet, with Pod networking
from Debian's CNI plugins (bridge + host-local). Everything Kubernetes is v1.20.2 built from
Debian's source package (scripts/kube-binaries.sh, scripts/kube-node.sh); the images come
from scripts/build-images.sh and are imported into the node's containerd.

Networking (README.md in this directory says why): a bridge ``sbk0`` made here carries the
node's address (``NODE_IP``, the bridge's gateway) and the Pods' subnet. The API server and
the kubelet serve on that address; Pods reach the node there. No kube-proxy and no cluster
DNS: Services get no traffic, so the chart's test values put the portal's Pods on the host
network and point them at the API server directly.

State: the containerd root (its images) persists in ``$SERVEBENCH_CACHE/node/containerd``
so images are imported once per content key; everything else lives in a temporary
directory and is removed by ``stop()``, which also ends every container, unmounts the
kubelet's volumes, deletes the bridge and restores the kernel settings the kubelet changed.
One cluster per machine at a time (a lock file).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import ipaddress
import json
import os
import shutil
import signal
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
from typing import IO, Any

CACHE = Path(os.environ.get("SERVEBENCH_CACHE") or Path.home() / ".cache" / "servebench")
KUBE_BIN = Path(os.environ.get("SERVEBENCH_KUBE_DIR") or CACHE / "kube") / "bin"
NODE_DIR = CACHE / "node"
CNI_BIN = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
BRIDGE = os.environ.get("SERVEBENCH_NODE_BRIDGE", "sbk0")
# The Pods' subnet; its first address is the bridge's, which is the node's address.
SUBNET = ipaddress.ip_network(os.environ.get("SERVEBENCH_NODE_SUBNET", "10.213.0.0/24"))
NODE_IP = str(next(SUBNET.hosts()))
# The bridge's MAC, fixed. A Linux bridge made without one takes the lowest MAC of its
# ports, so it changed whenever a Pod's veth came or went; the Pods' ARP entries for the
# node's address then pointed at the old MAC, and their calls to the API server and the web
# went unanswered until the entry expired (up to a minute: a CI run lost a point to it).
# Locally administered, unicast.
BRIDGE_MAC = "02:73:62:6b:30:01"
NODE_NAME = "sb-node"
SERVICE_CIDR = "10.96.0.0/16"
CONTROLLERS = (
    "job,garbagecollector,ttl-after-finished,namespace,serviceaccount,serviceaccount-token,"
    "deployment,replicaset,"
    "persistentvolume-binder,podgc,nodelifecycle"
)
# The kubelet sets these (it needs them); stop() puts back what the machine had (and
# ip_forward, should anything in the node turn it on).
KERNEL_TUNABLES = (
    "net/ipv4/ip_forward",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
)
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
HOW = (
    "run `make k8s-images` as root (scripts/kube-binaries.sh and scripts/kube-node.sh build "
    "Kubernetes 1.20.2 from Debian's source and install containerd, runc, buildah and the CNI "
    "plugins; scripts/build-images.sh builds the images), once"
)


def missing() -> list[str]:
    """What this machine lacks to run the cluster (empty: nothing)."""
    lacking = [name for name in BINARIES if not os.access(KUBE_BIN / name, os.X_OK)]
    for name in ("containerd", "runc", "ctr", "buildah", "ip"):
        if shutil.which(name) is None:
            lacking.append(name)
    if not (CNI_BIN / "bridge").exists():
        lacking.append("CNI plugins (containernetworking-plugins)")
    if os.geteuid() != 0:
        lacking.append("root")
    return lacking


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sh(*argv: str, check: bool = True, timeout: float = 600, **kw: Any) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and result.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(argv)}` exited {result.returncode}: {result.stderr.strip()[-2000:]}"
        )
    return result.stdout


# --------------------------------------------------------------------------- certificates


def write_pki(directory: Path) -> None:
    """A CA-signed serving certificate for the API server (its addresses and the in-cluster
    names) and a service-account key pair."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    def pem(key: Any) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )

    now = dt.datetime.now(dt.UTC)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "servebench-e2e-apiserver")])
    service_ip = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
    addresses = ["127.0.0.1", NODE_IP, service_ip]
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"]
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
                [x509.DNSName(d) for d in dns]
                + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    (directory / "serving.key").write_bytes(pem(key))
    (directory / "serving.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "sa.key").write_bytes(pem(sa))
    (directory / "sa.pub").write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def kubeconfig_text(server: str, ca: Path, token: str, namespace: str = "default") -> str:
    cluster = {"server": server, "certificate-authority": str(ca)}
    context = {"cluster": "e2e", "user": "e2e", "namespace": namespace}
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [{"name": "e2e", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": context}],
    })  # fmt: skip


# --------------------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    dir: Path
    api_port: int
    token: str
    pause_image: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    _lock: IO[str] | None = None
    _tunables: dict[str, str] = field(default_factory=dict)
    _netns: set[str] = field(default_factory=set)

    @property
    def server(self) -> str:
        return f"https://{NODE_IP}:{self.api_port}"

    @property
    def ca(self) -> Path:
        return self.dir / "serving.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "run" / "containerd.sock"

    def log(self, name: str, lines: int = 40) -> str:
        path = self.dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def get(self, path: str, timeout: float = 3) -> tuple[int, str]:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        req = urllib.request.Request(  # noqa: S310 (our own API server)
            self.server + path, headers={"Authorization": f"Bearer {self.token}"}
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:  # noqa: S310
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            return 0, str(exc)

    def api_client(self) -> Any:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=cfg)
        return client.ApiClient(cfg)

    def ctr(self, *args: str, timeout: float = 900) -> str:
        return sh("ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args,
                  timeout=timeout)  # fmt: skip

    # ----------------------------------------------------------------- processes

    def _start(self, name: str, argv: list[str]) -> None:
        with (self.dir / f"{name}.log").open("wb") as log:
            self.procs[name] = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, cwd=self.dir,
            )  # fmt: skip

    def _await(self, name: str, ready: Callable[[], Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"{name} was not ready after {timeout:.0f} s:\n{self.log(name)}")

    def _stop(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    # ----------------------------------------------------------------- start

    @classmethod
    def start(cls, pause_image: str) -> Cluster:
        """Start everything (``pause_image``: the Pod sandbox image, imported first); raises
        RuntimeError naming the part that did not come up."""
        NODE_DIR.mkdir(parents=True, exist_ok=True)
        lock = (NODE_DIR / "lock").open("w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise RuntimeError(
                f"another test cluster runs on this machine (lock {NODE_DIR / 'lock'})"
            ) from None
        # The kubelet's volumes (tmpfs) must not sit in /dev/shm; a short path for sockets.
        directory = Path(tempfile.mkdtemp(prefix="sb-e2e-", dir="/run"))
        cluster = cls(directory, free_port(), uuid.uuid4().hex, pause_image, _lock=lock)
        try:
            cluster._start_all()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_all(self) -> None:
        began = time.monotonic()
        d = self.dir
        _delete_bridge()  # left by a killed session (the lock says none runs now)
        self._netns = set(_netns())
        for name in KERNEL_TUNABLES:
            path = Path("/proc/sys") / name
            if path.exists():
                self._tunables[name] = path.read_text().strip()
        self._bridge_up()
        write_pki(d)
        node_token = uuid.uuid4().hex
        (d / "tokens.csv").write_text(
            f"{self.token},servebench-e2e,1,system:masters\n"
            f'{node_token},system:node:{NODE_NAME},2,"system:nodes"\n'
        )
        self.kubeconfig.write_text(kubeconfig_text(self.server, self.ca, self.token))
        (d / "kubelet.kubeconfig").write_text(kubeconfig_text(self.server, self.ca, node_token))
        etcd_port, peer_port = free_port(), free_port()
        etcd_url, peer_url = f"http://127.0.0.1:{etcd_port}", f"http://127.0.0.1:{peer_port}"
        self._start("etcd", [
            str(KUBE_BIN / "etcd"), "--name", "e2e", "--data-dir", str(d / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"e2e={peer_url}", "--log-level", "warn",
            "--unsafe-no-fsync",
        ])  # fmt: skip
        self._await("etcd", lambda: _http_ok(f"{etcd_url}/health"), 30)
        self._start("kube-apiserver", [
            str(KUBE_BIN / "kube-apiserver"),
            "--etcd-servers", etcd_url,
            "--bind-address", NODE_IP, "--advertise-address", NODE_IP,
            "--secure-port", str(self.api_port),
            "--tls-cert-file", str(self.ca), "--tls-private-key-file", str(d / "serving.key"),
            "--cert-dir", str(d / "certs"),
            "--token-auth-file", str(d / "tokens.csv"),
            "--service-account-key-file", str(d / "sa.pub"),
            "--service-account-signing-key-file", str(d / "sa.key"),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--authorization-mode", "Node,RBAC",
            "--kubelet-preferred-address-types", "InternalIP",
            "--feature-gates", "TTLAfterFinished=true",
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--profiling=false", "--v", "1",
        ])  # fmt: skip
        self._await("kube-apiserver", lambda: self.get("/readyz")[0] == 200, 120)
        self._start("kube-controller-manager", [
            str(KUBE_BIN / "kube-controller-manager"),
            "--kubeconfig", str(self.kubeconfig),
            "--controllers", CONTROLLERS,
            "--service-account-private-key-file", str(d / "sa.key"),
            "--root-ca-file", str(self.ca),
            "--feature-gates", "TTLAfterFinished=true",
            "--leader-elect=false", "--port", "0", "--secure-port", "0", "--v", "1",
        ])  # fmt: skip
        self._start("kube-scheduler", [
            str(KUBE_BIN / "kube-scheduler"),
            "--kubeconfig", str(self.kubeconfig),
            "--leader-elect=false", "--port", "0", "--secure-port", "0", "--v", "1",
        ])  # fmt: skip
        self._await(
            "kube-controller-manager",
            lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            90,
        )
        self._start_containerd()
        self.import_images([self.pause_image])
        self._start_kubelet()
        self._await("kubelet", self._node_ready, 180)
        self.timings["cluster start"] = time.monotonic() - began

    def _bridge_up(self) -> None:
        sh("ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge")
        sh("ip", "addr", "add", f"{NODE_IP}/{SUBNET.prefixlen}", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")

    def _start_containerd(self) -> None:
        d = self.dir
        (d / "cni").mkdir()
        (d / "cni" / "10-servebench.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "servebench",
            "plugins": [{
                # Not a gateway: Pods reach the node's subnet (the web, on the bridge's
                # address) and nothing beyond, and the plugin leaves ip_forward alone.
                "type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local", "dataDir": str(d / "cni-ipam"),
                    "ranges": [[{"subnet": str(SUBNET), "gateway": NODE_IP}]],
                },
            }],
        }))  # fmt: skip
        pause = self.pause_image
        root = NODE_DIR / "containerd"
        (d / "containerd.toml").write_text(f"""version = 2
root = "{root}"
state = "{d / "containerd-state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{self.containerd_socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # These machines withhold CAP_SYS_RESOURCE even from root, so no process may lower its
  # oom_score_adj: runc cannot give the Pod sandbox its -998 ("failed to update
  # /proc/self/oom_score_adj: Permission denied", the sandbox never starts). Clamp
  # every container's score to containerd's own instead (what rootless nodes do).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_tls_streaming = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{d / "cni"}"
    max_conf_num = 1
""")
        (d / "run").mkdir()
        self._start("containerd", ["containerd", "--config", str(d / "containerd.toml")])
        self._await("containerd", lambda: self.containerd_socket.exists(), 60)
        self._await("containerd", lambda: _succeeds("ctr", "--address",
                    str(self.containerd_socket), "version"), 60)  # fmt: skip

    def _start_kubelet(self) -> None:
        d = self.dir
        port, healthz = free_port(), free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            # The API server reads logs and execs through the kubelet; it sends no client
            # certificate here, so the kubelet's own API is open to its address only.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "makeIPTablesUtilChains": False,
            "clusterDomain": "cluster.local",
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            # A shared machine: never evict for disk or memory others use, never collect
            # the images we imported.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "maxPods": 30,
        }  # fmt: skip
        (d / "kubelet.yaml").write_text(json.dumps(config))
        self._start("kubelet", [
            str(KUBE_BIN / "kubelet"),
            "--config", str(d / "kubelet.yaml"),
            "--kubeconfig", str(d / "kubelet.kubeconfig"),
            "--container-runtime", "remote",
            "--container-runtime-endpoint", f"unix://{self.containerd_socket}",
            "--image-service-endpoint", f"unix://{self.containerd_socket}",
            "--root-dir", str(d / "kubelet"),
            "--cert-dir", str(d / "kubelet-pki"),
            "--hostname-override", NODE_NAME,
            "--node-ip", NODE_IP,
            "--v", "1",
        ])  # fmt: skip

    def _node_ready(self) -> bool:
        status, body = self.get(f"/api/v1/nodes/{NODE_NAME}")
        if status != 200:
            return False
        conditions = json.loads(body).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # ----------------------------------------------------------------- images

    def import_images(self, images: list[str]) -> None:
        """Put each buildah-built image into the node's containerd, unless it is there."""
        began = time.monotonic()
        have = set(self.ctr("images", "ls", "-q").split())
        for image in images:
            if image in have:
                continue
            with tempfile.TemporaryDirectory(dir=NODE_DIR) as tmp:
                archive = Path(tmp) / "image.tar"
                sh(*buildah(), "push", "--quiet", image, f"docker-archive:{archive}:{image}",
                   timeout=1200)  # fmt: skip
                self.ctr("images", "import", str(archive))
        self.timings["images import"] = self.timings.get("images import", 0) + (
            time.monotonic() - began
        )

    def forget_other_images(self, keep: list[str]) -> None:
        """Remove the node's images of older keys (the containerd root is cached), by name
        and by the ``sha256:<image id>`` name the CRI plugin adds; their layers go with them."""
        have = self.ctr("images", "ls", "-q").split()
        ids = {self.image_digest(image)["config"] for image in keep if image in have}
        for image in have:
            ours = image.startswith("localhost/servebench-") and image not in keep
            if ours or (image.startswith("sha256:") and image not in ids):
                self.ctr("images", "rm", "--sync", image)

    def image_digest(self, image: str) -> dict[str, str]:
        """The manifest digest and the image ID (config digest) containerd holds for it."""
        out = self.ctr("images", "ls", f"name=={image}")
        digest = out.splitlines()[1].split()[2]
        config = json.loads(self.ctr("content", "get", digest))["config"]["digest"]
        return {"manifest": digest, "config": config}

    # ----------------------------------------------------------------- stop

    def delete_all_pods(self, timeout: float = 90) -> None:
        """Delete every Pod now and wait for the kubelet to tear them down (CNI included)."""
        from kubernetes import client

        core = client.CoreV1Api(self.api_client())
        for ns in core.list_namespace().items:
            core.delete_collection_namespaced_pod(ns.metadata.name, grace_period_seconds=0)
        with contextlib.suppress(AssertionError):  # stop() removes the rest through containerd
            wait_for(lambda: not core.list_pod_for_all_namespaces().items, timeout, "no Pods")

    def stop(self) -> None:
        """Stop every Pod's containers, then the node and the control plane; clean up."""
        # First what would recreate or place Pods (Jobs, ReplicaSets): then the Pods go.
        self._stop("kube-controller-manager")
        self._stop("kube-scheduler")
        kubelet = self.procs.get("kubelet")
        if kubelet is not None and kubelet.poll() is None and self.get("/readyz")[0] == 200:
            try:
                self.delete_all_pods()
            except Exception as exc:  # best effort: containerd is next
                print(f"e2e cluster: deleting the Pods failed ({exc}); removing containers")
        self._stop("kubelet")
        if self.procs.get("containerd") and self.procs["containerd"].poll() is None:
            _remove_cri_pods(self.containerd_socket)
        for name in ("containerd", "kube-apiserver", "etcd"):
            self._stop(name)
        _unmount_under(self.dir)
        for ns in set(_netns()) - self._netns:
            subprocess.run(["umount", f"/var/run/netns/{ns}"], capture_output=True, timeout=30)
            Path(f"/var/run/netns/{ns}").unlink(missing_ok=True)
        _delete_bridge()
        for name, value in self._tunables.items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / name).write_text(value)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def buildah() -> list[str]:
    return ["buildah", "--root", str(CACHE / "images" / "storage"),
            "--runroot", "/run/servebench-buildah", "--storage-driver", "overlay"]  # fmt: skip


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 (our own etcd)
            return resp.status == 200
    except OSError:
        return False


def _succeeds(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def _remove_cri_pods(socket: Path) -> None:
    """Kill and remove every container and Pod sandbox in the node's containerd."""
    base = ["ctr", "--address", str(socket), "-n", "k8s.io"]
    for line in sh(*base, "tasks", "ls", "-q", check=False).split():
        sh(*base, "tasks", "kill", "-s", "SIGKILL", line, check=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        remaining = sh(*base, "tasks", "ls", "-q", check=False).split()
        for task in remaining:
            sh(*base, "tasks", "delete", "-f", task, check=False)
        if not remaining:
            break
        time.sleep(0.5)
    for line in sh(*base, "containers", "ls", "-q", check=False).split():
        sh(*base, "containers", "delete", line, check=False)


def _unmount_under(directory: Path) -> None:
    """Unmount what the kubelet and containerd mounted under ``directory`` (deepest first)."""
    prefix = str(directory) + "/"
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            mounts.append(point)
    for point in sorted(set(mounts), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)


def _netns() -> list[str]:
    """The Pod network namespaces containerd's CRI made (cni-<uuid>)."""
    path = Path("/var/run/netns")
    return [p.name for p in path.glob("cni-*")] if path.exists() else []


def bridge_mac() -> str:
    """The bridge's MAC now (``ip -br link``)."""
    out = subprocess.run(
        ["ip", "-br", "link", "show", BRIDGE], capture_output=True, text=True, timeout=30
    ).stdout.split()
    return out[2] if len(out) > 2 else ""


def _delete_bridge() -> None:
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, timeout=30)


# --------------------------------------------------------------------------- the test's view

# Each phase's time (printed at the end of the session by conftest.py).
TIMINGS: dict[str, float] = {}


def kubectl(cluster: Cluster, *args: str, timeout: float = 120, check: bool = True) -> str:
    binary = str(KUBE_BIN / "kubectl")
    if not Path(binary).exists():
        binary = shutil.which("kubectl") or binary
    return sh(binary, "--kubeconfig", str(cluster.kubeconfig), *args, timeout=timeout,
              check=check)  # fmt: skip


@dataclass
class Release:
    namespace: str
    values: dict[str, Any]
    install_output: str
    model_dir: str


@dataclass
class Portal:
    base: str
    token: str

    def request(self, method: str, path: str, body: Any = None, auth: bool = True) -> Any:
        headers = {"Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base + path, data, headers, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 (our web Pod)
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise AssertionError(
                f"{method} {path}: {exc.code} {exc.read().decode()[:2000]}"
            ) from None
        return json.loads(text) if "json" in (resp.headers.get("Content-Type") or "") else text

    def run(self, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"/api/v1/runs/{run_id}/")


def wait_status(portal: Portal, run_id: str, statuses: set[str], timeout: float) -> dict[str, Any]:
    return wait_for(
        lambda: (r := portal.run(run_id))["status"] in statuses and r,
        timeout,
        f"run {run_id} to reach {sorted(statuses)}",
        interval=2,
    )
