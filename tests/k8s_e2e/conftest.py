"""Fixtures for the end-to-end test on a real one-node cluster (README.md here).

- ``images`` (session): scripts/build-images.sh (content-keyed: cached builds take seconds).
- ``cluster`` (session): etcd, API server, controller manager, scheduler, containerd and
  the kubelet (``e2e_cluster.Cluster``), with the images imported; stopped at the end.
- ``release`` (session): the chart installed with ``helm install --wait`` into a fresh
  namespace, against a database of its own on this machine's PostgreSQL (the migrations
  hook creates its tables) and this machine's Redis.
- ``portal`` (session): an HTTP client of the web Pod with a CI token made in that Pod.

What the machine lacks skips locally and fails in CI (``need``). Each phase's time is
printed at the end of the session (``pytest_terminal_summary``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import e2e_cluster
import pytest
from e2e_cluster import NODE_IP, TIMINGS, Cluster, Portal, Release, kubectl, sh

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "servebench"
NAMESPACE = f"sb-e2e-{uuid.uuid4().hex[:6]}"
RELEASE = "servebench"
WEB_PORT = 8000  # the portal image's gunicorn --bind; on the node (host network)
HF_MOUNT = "/root/.cache/huggingface"  # the chart's runner.hfCache.mountPath


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        terminalreporter.section("k8s e2e phases")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"k8s-e2e: phase '{name}' took {seconds:.0f} s")


@pytest.fixture(scope="session")
def images(need: Callable[..., None]) -> dict[str, str]:
    lacking = e2e_cluster.missing()
    need(not lacking, f"a one-node test cluster ({', '.join(lacking)} missing)", e2e_cluster.HOW)
    began = time.monotonic()
    result = subprocess.run(
        [str(REPO / "scripts" / "build-images.sh")],
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        pytest.fail(f"scripts/build-images.sh failed:\n{result.stderr[-4000:]}", pytrace=False)
    TIMINGS["images (build or cache check)"] = time.monotonic() - began
    return dict(line.split("=", 1) for line in result.stdout.split() if "=" in line)


@pytest.fixture(scope="session")
def cluster(images: dict[str, str], early_stop: Any) -> Iterator[Cluster]:
    """The one-node cluster; its API server, kubelet and containerd stop as soon as this
    directory's last test ends (``early_stop``), not with the whole session."""
    try:
        c = Cluster.start(images["PAUSE_IMAGE"])
    except RuntimeError as exc:
        pytest.fail(f"the test cluster did not start: {exc}", pytrace=False)

    def stop() -> None:
        began = time.monotonic()
        c.stop()
        TIMINGS["cluster stop"] = time.monotonic() - began

    stop_once = early_stop(Path(__file__).parent, stop)
    try:
        c.import_images([images["PORTAL_IMAGE"], images["RUNNER_IMAGE"]])
        c.forget_other_images(list(images.values()))
        TIMINGS.update(c.timings)
        yield c
    finally:
        stop_once()


# --------------------------------------------------------------------------- services


def _database(url: str) -> tuple[str, str]:
    """(admin URL, URL of a new database) on the server of DATABASE_URL."""
    parts = urllib.parse.urlsplit(url)
    name = f"sb_e2e_{uuid.uuid4().hex[:8]}"
    return parts._replace(path="/postgres").geturl(), parts._replace(path=f"/{name}").geturl()


@pytest.fixture(scope="session")
def database_url(need: Callable[..., None]) -> Iterator[str]:
    """A database of its own on this machine's PostgreSQL (TCP, so host-network Pods reach
    it); dropped at the end."""
    import psycopg

    url = os.environ.get("DATABASE_URL", "")
    host = urllib.parse.urlsplit(url).hostname or ""
    need(host in ("127.0.0.1", "localhost"), "DATABASE_URL on 127.0.0.1",
         "the test Pods use the machine's PostgreSQL over TCP (set DATABASE_URL)")  # fmt: skip
    admin, created = _database(url)
    name = urllib.parse.urlsplit(created).path.lstrip("/")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield created
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def redis_url(need: Callable[..., None]) -> str:
    url = os.environ.get("REDIS_URL", "")
    host = urllib.parse.urlsplit(url).hostname or ""
    need(host in ("127.0.0.1", "localhost"), "REDIS_URL on 127.0.0.1",
         "the test Pods use the machine's Redis over TCP (set REDIS_URL)")  # fmt: skip
    return url


# --------------------------------------------------------------------------- the release


def _hostpath_pv(name: str, path: Path, size: str, mode: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size}, "accessModes": [mode],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": NAMESPACE, "name": claim},
        },
    }  # fmt: skip


@pytest.fixture(scope="session")
def release(
    cluster: Cluster, images: dict[str, str], database_url: str, redis_url: str, tiny_model: Path
) -> Release:
    import yaml

    busy = sh("ss", "-H", "-ltn", f"sport = :{WEB_PORT}").strip()
    if busy:
        pytest.fail(f"port {WEB_PORT} on this machine is taken ({busy}); the web Pod "
                    "listens there (host network)", pytrace=False)  # fmt: skip
    kubectl(cluster, "create", "namespace", NAMESPACE)
    # The volumes the chart's claims bind to: directories on the node.
    samples = cluster.dir / "volumes" / "samples"
    hf = cluster.dir / "volumes" / "hf-cache"
    samples.mkdir(parents=True)
    os.chown(samples, 10001, 10001)  # the web's uid; hostPath ignores fsGroup
    shutil.copytree(tiny_model, hf / "tiny-model")
    pvs = [
        _hostpath_pv(f"{NAMESPACE}-samples", samples, "50Gi", "ReadWriteOnce",
                     f"{RELEASE}-samples"),
        _hostpath_pv(f"{NAMESPACE}-hf-cache", hf, "500Gi", "ReadWriteMany",
                     f"{RELEASE}-hf-cache"),
    ]  # fmt: skip
    (cluster.dir / "pvs.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                                      "items": pvs}))  # fmt: skip
    kubectl(cluster, "apply", "-f", str(cluster.dir / "pvs.json"))
    portal_repo, portal_tag = images["PORTAL_IMAGE"].rsplit(":", 1)
    runner_repo, runner_tag = images["RUNNER_IMAGE"].rsplit(":", 1)
    public = f"http://{NODE_IP}:{WEB_PORT}"
    values = {
        "image": {"repository": portal_repo, "tag": portal_tag},
        "publicUrl": public,
        "hostNetwork": True,
        "queue": f"servebench-{NAMESPACE}",
        "secrets": {
            "databaseUrl": database_url,
            "redisUrl": redis_url,
            "secretKey": "e2e-" + uuid.uuid4().hex * 2,
        },
        # No kube-proxy here: the API server directly, not the `kubernetes` Service.
        "extraEnv": {
            "KUBERNETES_SERVICE_HOST": NODE_IP,
            "KUBERNETES_SERVICE_PORT": str(cluster.api_port),
        },
        "web": {"replicas": 1, "concurrency": 2},
        "worker": {"concurrency": 2},
        "runner": {
            "image": {"repository": runner_repo, "tag": runner_tag},
            "resources": {"cpu": "1", "memory": "6Gi"},
            # A run whose servers run apart: the runner Pod (the load generator) asks for
            # this, and creates its server Pods through the API server's real address.
            "clientResources": {"cpu": "500m", "memory": "3Gi"},
            # Each load generator's Pod (workload.clients): three fit beside the rest.
            "loadgenResources": {"cpu": "100m", "memory": "1Gi"},
            "kubeApiUrl": f"https://{NODE_IP}:{cluster.api_port}",
            "hfCache": {"create": True},
            "modelRoots": [HF_MOUNT],
            # No cluster DNS: runners report to the web on the node's address.
            "reportUrl": public,
            "ttlSecondsAfterFinished": 3600,
        },
    }
    values_file = cluster.dir / "values-e2e.yaml"
    values_file.write_text(yaml.safe_dump(values))
    began = time.monotonic()
    helm = str(e2e_cluster.KUBE_BIN / "helm")
    result = subprocess.run(
        [helm, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
         "--kubeconfig", str(cluster.kubeconfig), "-f", str(values_file),
         "--wait", "--timeout", "10m"],
        capture_output=True, text=True, timeout=700, check=False,
    )  # fmt: skip
    TIMINGS["helm install"] = time.monotonic() - began
    if result.returncode != 0:
        pods = kubectl(cluster, "get", "pods", "-A", "-o", "wide", check=False)
        events = kubectl(cluster, "get", "events", "-A", check=False)
        pytest.fail(
            f"helm install failed:\n{result.stderr[-3000:]}\n{pods}\n{events[-4000:]}\n"
            f"kubelet:\n{cluster.log('kubelet')}",
            pytrace=False,
        )
    return Release(NAMESPACE, values, result.stdout, f"{HF_MOUNT}/tiny-model")


# --------------------------------------------------------------------------- the portal


@pytest.fixture(scope="session")
def portal(cluster: Cluster, release: Release) -> Portal:
    """A CI token made the way NOTES.txt says: manage.py commands in the web Pod."""
    web = f"deploy/{RELEASE}-web"
    manage = ["-n", NAMESPACE, "exec", web, "--", "python", "manage.py"]
    password = "DJANGO_SUPERUSER_PASSWORD=" + uuid.uuid4().hex
    user = ["--noinput", "--username", "e2e", "--email", "e2e@example.com"]
    kubectl(cluster, *manage[:5], "env", password, *manage[5:], "createsuperuser", *user)
    token = kubectl(cluster, *manage, "createtoken", "e2e").strip().splitlines()[-1]
    assert token.startswith("sb_"), token
    return Portal(f"http://{NODE_IP}:{WEB_PORT}", token)
