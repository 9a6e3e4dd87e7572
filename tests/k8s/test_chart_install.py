"""The chart and the manifests against the real control plane.

``helm install`` waits for the migrations hook Job: the test plays its kubelet by running
the hook container's own command (``python manage.py migrate``) with the Pod's own
environment against the test database, then reports the container's exit. Then the portal
runs a benchmark Job with nothing but the chart's ServiceAccount and Role (RBAC is on).
Deployments get no Pods here (no scheduler, no deployment controller): their objects are
checked, and the Dockerfile test covers the commands they run.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from typing import Any

import pytest
import yaml
from k8s_support import (
    CHART,
    CHART_NAMESPACE,
    CHART_RELEASE,
    GPU_TYPE,
    KUSTOMIZE,
    REPO,
    create_namespace,
    gpu_spec,
    run_tool,
)
from kubernetes import client
from kubernetes.client.rest import ApiException

from portal.benchmarks.models import RunStatus
from portal.dispatch import dispatcher
from portal.dispatch.executors import ExecutorState, get_executor

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(240)]

RUNNER_IMAGE = "registry.example.com/servebench-runner:chart-test"


def pod_environment(core: Any, pod: Any) -> dict[str, str]:
    """The container's environment as the kubelet would build it (values and secretRefs)."""
    (container,) = pod.spec.containers
    env: dict[str, str] = {}
    for source in container.env_from or []:
        if source.secret_ref:
            secret = core.read_namespaced_secret(source.secret_ref.name, pod.metadata.namespace)
            env.update({k: base64.b64decode(v).decode() for k, v in secret.data.items()})
    for var in container.env or []:
        env[var.name] = var.value or ""
    return env


@pytest.fixture(scope="module")
def installed(helm, control_plane, kube_api, kubelet_admin, test_database_url) -> dict[str, Any]:
    """The chart, installed once for this module (the hook really migrates)."""
    create_namespace(kube_api, CHART_NAMESPACE)
    values = control_plane.dir / "values-test.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "publicUrl": "http://servebench.test",
                "secrets": {
                    "databaseUrl": test_database_url,  # migrated already: nothing to apply
                    "redisUrl": os.environ["REDIS_URL"],
                },
                "runner": {
                    "image": {"repository": RUNNER_IMAGE.split(":")[0], "tag": "chart-test"}
                },
            }
        )
    )
    argv = [
        helm, "install", CHART_RELEASE, str(CHART), "--namespace", CHART_NAMESPACE,
        "--kubeconfig", str(control_plane.kubeconfig), "-f", str(values), "--timeout", "150s",
    ]  # fmt: skip
    helm_run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        core = client.CoreV1Api(kube_api)
        pod = kubelet_admin.pod_of("servebench-migrate", timeout=60, namespace=CHART_NAMESPACE)
        env = pod_environment(core, pod)
        (container,) = pod.spec.containers
        assert container.command == ["python", "manage.py", "migrate", "--noinput"]
        migrate = subprocess.run(
            [sys.executable, *container.command[1:]],
            cwd=REPO,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        kubelet_admin.terminated(
            pod, migrate.returncode, reason="Completed" if migrate.returncode == 0 else "Error",
            message=migrate.stdout[-2000:] + migrate.stderr[-2000:],
        )  # fmt: skip
        assert migrate.returncode == 0, migrate.stderr
        output, _ = helm_run.communicate(timeout=150)
    finally:
        if helm_run.poll() is None:
            helm_run.kill()
            helm_run.wait()
    assert helm_run.returncode == 0, output
    return {"output": output, "migrate": migrate.stdout, "env": env}


@pytest.fixture(scope="module")
def kubelet_admin(kube_api: Any) -> Any:
    from k8s_support import Kubelet

    return Kubelet(kube_api, CHART_NAMESPACE)


def test_helm_install_runs_the_migrations_hook_then_creates_the_release(installed, kube_api):
    assert "No migrations to apply." in installed["migrate"]
    env = installed["env"]
    assert env["SERVEBENCH_EXECUTOR"] == "kubernetes"
    assert env["SERVEBENCH_K8S_RUNNER_IMAGE"] == RUNNER_IMAGE
    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    rbac, batch = client.RbacAuthorizationV1Api(kube_api), client.BatchV1Api(kube_api)
    ns = CHART_NAMESPACE
    deployments = {d.metadata.name: d for d in apps.list_namespaced_deployment(ns).items}
    assert set(deployments) == {"servebench-web", "servebench-worker", "servebench-beat"}
    assert deployments["servebench-beat"].spec.replicas == 1
    assert deployments["servebench-beat"].spec.strategy.type == "Recreate"
    assert core.read_namespaced_service("servebench-web", ns).spec.ports[0].port == 8000
    assert core.read_namespaced_config_map("servebench", ns).data["SERVEBENCH_K8S_NAMESPACE"] == ns
    assert core.read_namespaced_secret("servebench", ns).data["DATABASE_URL"]
    assert core.read_namespaced_service_account("servebench", ns)
    assert rbac.read_namespaced_role("servebench-runner-jobs", ns).rules
    assert rbac.read_namespaced_role_binding("servebench-runner-jobs", ns).subjects[0].name == (
        "servebench"
    )
    # The hook Job stays (its log); its Secret copy was deleted once it succeeded.
    hook = batch.read_namespaced_job("servebench-migrate", ns)
    assert hook.metadata.annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert hook.status.succeeded == 1
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_secret("servebench-migrations", ns)
    assert gone.value.status == 404
    # NOTES.txt: how to reach the portal and make the first token.
    notes = installed["output"]
    assert "port-forward svc/servebench-web 8000:8000" in notes
    assert "python manage.py createsuperuser" in notes
    assert "python manage.py createtoken USERNAME" in notes


def test_the_charts_role_is_enough_to_run_a_benchmark_and_no_more(
    installed, control_plane, kube_api, kubelet_admin, make_run, settings, tmp_path
):
    """The executor authenticated as the release's ServiceAccount (RBAC is on)."""
    portal_config = control_plane.kubeconfig_for(
        tmp_path / "portal-kubeconfig",
        namespace=CHART_NAMESPACE,
        token=control_plane.tokens["portal"],
    )
    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    settings.SERVEBENCH_K8S_KUBECONFIG = portal_config
    settings.SERVEBENCH_K8S_NAMESPACE = CHART_NAMESPACE
    settings.SERVEBENCH_K8S_RUNNER_IMAGE = RUNNER_IMAGE
    settings.SERVEBENCH_GPU_TYPES = [GPU_TYPE]
    run = make_run(spec=gpu_spec())
    assert dispatcher.dispatch_run(run.pk) == "submitted"
    run.refresh_from_db()
    executor = get_executor("kubernetes")
    submitted = {k: v for k, v in run.executor_handle.items() if k != "attempts"}
    assert executor.submit(run, "sb_run_again") == submitted  # get + patch Secret
    pod = kubelet_admin.pod_of(run.executor_handle["job"])
    kubelet_admin.running(pod)
    assert executor.status(run.executor_handle).state == ExecutorState.RUNNING
    assert executor.logs(run.executor_handle) == ""  # allowed; no kubelet serves it here
    kubelet_admin.terminated(pod, 3, message="boom")
    kubelet_admin.job_condition(run.executor_handle["job"])
    dispatcher.reconcile()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and "runner exited with code 3" in run.failure_reason
    assert executor.logs(run.executor_handle) == "boom"
    executor.cancel(run.executor_handle)

    # A Pod that can never start: the executor may end its Job (patch) and say why.
    settings.SERVEBENCH_K8S_START_GRACE_SECONDS = 0
    stuck = make_run(spec=gpu_spec())
    assert dispatcher.dispatch_run(stuck.pk) == "submitted"
    stuck.refresh_from_db()
    job = stuck.executor_handle["job"]
    kubelet_admin.waiting(kubelet_admin.pod_of(job), "ErrImagePull", "manifest unknown")
    status = get_executor("kubernetes").status(stuck.executor_handle)
    assert status.state == ExecutorState.FAILED
    annotations = client.BatchV1Api(kube_api).read_namespaced_job(job, CHART_NAMESPACE)
    assert annotations.metadata.annotations["servebench.dev/failure"] == status.reason

    # ...and no more: the portal's account cannot read Secrets or make Pods itself.
    from kubernetes import config

    cfg = client.Configuration()
    config.load_kube_config(config_file=portal_config, client_configuration=cfg)
    as_portal = client.CoreV1Api(client.ApiClient(cfg))
    for forbidden in (
        lambda: as_portal.list_namespaced_secret(CHART_NAMESPACE),
        lambda: as_portal.read_namespaced_secret("servebench", CHART_NAMESPACE),
        lambda: as_portal.create_namespaced_pod(
            CHART_NAMESPACE,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="x"),
                spec=client.V1PodSpec(containers=[client.V1Container(name="x", image="x")]),
            ),
        ),
        lambda: as_portal.list_namespaced_pod("default"),
    ):
        with pytest.raises(ApiException) as refused:
            forbidden()
        assert refused.value.status == 403


def test_the_manifests_pass_a_server_side_dry_run(kubectl, control_plane, kube_api):
    """What schemas cannot check (names, references, defaults) the API server does."""
    create_namespace(kube_api, "servebench")
    result = run_tool([
        kubectl, "--kubeconfig", str(control_plane.kubeconfig),
        "apply", "--dry-run=server", "-k", str(KUSTOMIZE),
    ])  # fmt: skip
    lines = result.stdout.strip().splitlines()
    # 13: the portal's objects, and the runner's ServiceAccount, Role and RoleBinding.
    assert len(lines) == 13 and all(line.endswith("(server dry run)") for line in lines), lines
    # Nothing was really created.
    assert client.AppsV1Api(kube_api).list_namespaced_deployment("servebench").items == []
