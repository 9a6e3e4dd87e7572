"""The chart on a real one-node cluster, with the images the Dockerfile builds.

Nothing is played here: the scheduler places Pods, the kubelet runs them in containerd
through runc, probes decide readiness, the Job controller and the garbage collector react
to what really happened. The migrations hook Job migrates a fresh database in a real Pod;
the web Pod becomes Ready through its /healthz probe; the worker creates each run's Job
from inside its Pod with the chart's ServiceAccount; the runner Pod (the runner image:
vLLM's CPU build) measures the tiny model and reports to the web Pod over the Pod network.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from e2e_cluster import (
    BRIDGE_MAC,
    NODE_IP,
    TIMINGS,
    Cluster,
    Portal,
    Release,
    bridge_mac,
    kubectl,
    wait_for,
    wait_status,
)
from kubernetes import client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3000)]


def tiny_spec(release: Release, **resources: Any) -> dict[str, Any]:
    return {
        "name": "tiny on a real node",
        "model": {"id": release.model_dir, "max_model_len": 512},
        "workload": {"input_len": 32, "output_len": 8, "num_prompts": 4, "num_warmups": 0},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [2]}],
        "backends": [
            {"kind": "hf-sequential", "num_prompts": 2},
            # vLLM's CPU build sizes its KV cache from the node's memory, not the Pod's
            # limit: 1 GiB keeps it inside the runner's 6Gi. Eager: torch.compile on CPUs
            # needs a C++ compiler, which the CPU stand-in image does not carry (the GPU
            # image compiles with Triton), and it would add minutes on 2 cores.
            {
                "kind": "vllm",
                "enforce_eager": True,
                "extra_args": ["--kv-cache-memory-bytes", str(1 << 30)],
            },
        ],
        "resources": {"gpu_count": 0, "timeout_minutes": 20, **resources},
    }


def runner_pods(cluster: Cluster, release: Release, run_id: str) -> list[Any]:
    core = client.CoreV1Api(cluster.api_client())
    selector = f"servebench.dev/run={run_id}"
    return core.list_namespaced_pod(release.namespace, label_selector=selector).items


def test_the_hook_migrated_in_a_real_pod_and_the_portal_runs(cluster: Cluster, release: Release):
    core = client.CoreV1Api(cluster.api_client())
    batch = client.BatchV1Api(cluster.api_client())
    ns = release.namespace
    hook = batch.read_namespaced_job("servebench-migrate", ns)
    assert hook.status.succeeded == 1
    (pod,) = core.list_namespaced_pod(ns, label_selector="job-name=servebench-migrate").items
    assert pod.spec.node_name == "sb-node" and pod.status.phase == "Succeeded"
    (container,) = pod.status.container_statuses
    assert container.state.terminated.exit_code == 0 and container.image_id
    log = kubectl(cluster, "-n", ns, "logs", pod.metadata.name)
    assert "Applying benchmarks." in log  # a fresh database: the hook created the tables

    for component in ("web", "worker", "beat"):
        (p,) = core.list_namespaced_pod(
            ns, label_selector=f"app.kubernetes.io/component={component}"
        ).items
        assert p.status.phase == "Running", (component, p.status)
        (status,) = p.status.container_statuses
        assert status.ready and status.restart_count == 0, (component, status)
        assert p.spec.security_context.run_as_user == 10001
    web = core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/component=web").items[0]
    ready = next(c for c in web.status.conditions if c.type == "Ready")
    assert ready.status == "True"  # the readiness probe (/healthz, which asks the database)
    events = core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={web.metadata.name}"
    )
    # Startup probes may fail while gunicorn starts (what they are for); after that, none.
    unhealthy = [
        e.message
        for e in events.items
        if e.reason == "Unhealthy" and not (e.message or "").startswith("Startup probe")
    ]
    assert not unhealthy, unhealthy
    worker_log = kubectl(cluster, "-n", ns, "logs", "deploy/servebench-worker")
    assert "ready." in worker_log  # celery's "celery@... ready."
    beat_log = kubectl(cluster, "-n", ns, "logs", "deploy/servebench-beat")
    assert "beat: Starting..." in beat_log


def test_a_tiny_run_goes_through_a_runner_pod_to_the_run_page(
    cluster: Cluster, release: Release, portal: Portal, images: dict[str, str]
):
    began = time.monotonic()
    created = portal.request(
        "POST", "/api/v1/runs/", {"spec": tiny_spec(release), "is_public": True}
    )
    run_id = created["id"]
    pods = wait_for(lambda: runner_pods(cluster, release, run_id), 120, "the runner's Pod")
    done = wait_status(portal, run_id, {"succeeded", "failed", "cancelled"}, 1500)
    TIMINGS["run (submit to succeeded)"] = time.monotonic() - began
    log = kubectl(cluster, "-n", release.namespace, "logs", pods[0].metadata.name, check=False)
    assert done["status"] == "succeeded", f"{done.get('failure_reason')}\n{log[-3000:]}"

    # The runner reports "finished", then writes its result file and exits.
    pod = wait_for(
        lambda: next(
            (p for p in runner_pods(cluster, release, run_id) if p.status.phase != "Running"),
            None,
        ),
        120,
        "the runner's Pod to end",
    )
    assert pod.spec.containers[0].image == images["RUNNER_IMAGE"]
    assert pod.status.phase == "Succeeded" and pod.status.pod_ip.startswith(
        NODE_IP.rsplit(".", 1)[0]
    )
    result = portal.request("GET", f"/api/v1/runs/{run_id}/result")
    measurements = result["measurements"]
    assert {m["backend"] for m in measurements} >= {"hf-sequential", "vllm"}, measurements
    for m in measurements:
        assert m["metrics"]["output_throughput"] > 0, m

    # The digest recorded is the image that ran: what the node's containerd holds for it.
    held = cluster.image_digest(images["RUNNER_IMAGE"])
    container = result["environment"]["container"]
    assert container["image_digest"] in held.values(), (container, held)
    assert pod.status.container_statuses[0].image_id.endswith(container["image_digest"])

    page = portal.request("GET", f"/runs/{run_id}/", auth=False)
    assert "vllm" in page and "hf-sequential" in page
    assert container["image_digest"] in page or container["image_digest"][:19] in page


def run_pods(core: Any, release: Release, run_id: str, component: str) -> list[Any]:
    """The run's Pods of one component (runner, server, loadgen)."""
    selector = f"servebench.dev/run={run_id},app.kubernetes.io/component={component}"
    return core.list_namespaced_pod(release.namespace, label_selector=selector).items


def test_a_config_search_measures_each_server_in_a_pod_of_its_own_and_ranks_them(
    cluster: Cluster, release: Release, portal: Portal
):
    """Servers apart (the chart's default), for a configuration search: the runner Pod
    creates each configuration's vLLM server as a Pod of its own with its own service
    account, measures it by Pod IP (its SLA search included), deletes it, and the run is
    ranked within its budget."""
    spec = tiny_spec(release)
    spec["name"] = "max_num_seqs search on a real node"
    spec["backends"] = [b for b in spec["backends"] if b["kind"] == "vllm"]
    spec["config_search"] = {
        "configs": [{"max_num_seqs": 4}, {"max_num_seqs": 1}, {"max_num_seqs": 8}],
        "budget": {"points": 12},
    }
    # A generous SLO (this test is about placement, not speed): concurrency 1 then 4.
    spec["sla_search"] = {
        "axis": "max_concurrency",
        "slo": {"p99_e2el_ms": 120_000},
        "low": 1,
        "high": 4,
        "max_points": 3,
        "confirm": "none",
    }
    began = time.monotonic()
    run_id = portal.request("POST", "/api/v1/runs/", {"spec": spec})["id"]
    core = client.CoreV1Api(cluster.api_client())

    def by_component(component: str) -> list[Any]:
        return run_pods(core, release, run_id, component)

    (runner,) = wait_for(lambda: by_component("runner"), 120, "the runner's Pod")
    (server,) = wait_for(lambda: by_component("server"), 600, "the first server's Pod")
    done = wait_status(portal, run_id, {"succeeded", "failed", "cancelled"}, 1500)
    TIMINGS["config search of 3, servers apart (submit to succeeded)"] = time.monotonic() - began
    log = kubectl(cluster, "-n", release.namespace, "logs", runner.metadata.name, check=False)
    assert done["status"] == "succeeded", f"{done.get('failure_reason')}\n{log[-3000:]}"

    (owner,) = server.metadata.owner_references
    assert (owner.kind, owner.uid) == ("Pod", runner.metadata.uid)
    assert server.spec.containers[0].command[2] == "vllm.entrypoints.openai.api_server"
    assert runner.spec.containers[0].resources.requests == {"cpu": "500m", "memory": "3Gi"}
    assert server.spec.containers[0].resources.requests["memory"] == "6Gi"
    result = portal.request("GET", f"/api/v1/runs/{run_id}/result")
    measurements = result["measurements"]
    assert all(m["status"] == "succeeded" for m in measurements), measurements
    assert len(measurements) <= 12  # within the budget
    # Each configuration's server was a Pod of its own on the node, reached by Pod IP.
    pods: dict[str, set[str]] = {}
    for m in measurements:
        conditions = m["conditions"]
        assert conditions["server_node"] == "sb-node"
        assert conditions["server_pod_ip"].startswith(NODE_IP.rsplit(".", 1)[0])
        pods.setdefault(m["backend"], set()).add(conditions["server_pod"])
    names = ["vllm-seqs4", "vllm-seqs1", "vllm-seqs8"]
    assert sorted(pods) == sorted(names), pods
    assert all(len(p) == 1 for p in pods.values()) and len(set.union(*pods.values())) == 3
    assert server.metadata.name in pods["vllm-seqs4"]
    # Searched and ranked: every configuration has an outcome and a row.
    outcomes = {c["name"]: c for c in result["config_search"]}
    assert sorted(outcomes) == sorted(names), result["config_search"]
    assert all(c["state"] in ("measured", "dropped") for c in outcomes.values()), outcomes
    ranking = result["ranking"]
    assert ranking["winner"] in names
    assert sorted(e["backend"] for e in ranking["entries"]) == sorted(names)
    assert ranking["entries"][0]["serve_command"].startswith("vllm serve")
    # Every server Pod stopped by the runner when it was done with it.
    wait_for(lambda: not by_component("server"), 120, "the server Pods to be deleted")


def test_three_client_pods_load_one_server_pod_and_merge_exactly(
    cluster: Cluster, release: Release, portal: Portal
):
    """``workload.clients: 3`` with the server apart: the runner Pod creates three load
    generator Pods (the runner image, no GPU, owned by the runner's Pod), releases them
    together through its rendezvous on its Pod IP, takes back their samples and merges
    them into one measurement; every client Pod is deleted after."""
    spec = tiny_spec(release)
    spec["name"] = "three load generators on a real node"
    spec["backends"] = [b for b in spec["backends"] if b["kind"] == "vllm"]
    spec["workload"] |= {"clients": 3, "num_prompts": 6}
    spec["sweeps"] = [{"name": "concurrency", "axis": "max_concurrency", "values": [3]}]
    # The node's 2 CPUs: the portal, the runner (500m), the server and three clients
    # (100m each) must all be scheduled at once.
    spec["resources"]["cpu"] = "200m"
    began = time.monotonic()
    run_id = portal.request("POST", "/api/v1/runs/", {"spec": spec})["id"]
    core = client.CoreV1Api(cluster.api_client())

    def by_component(component: str) -> list[Any]:
        return run_pods(core, release, run_id, component)

    (runner,) = wait_for(lambda: by_component("runner"), 120, "the runner's Pod")
    loadgens = wait_for(
        lambda: (pods := by_component("loadgen")) and len(pods) == 3 and pods,
        900,
        "the three client Pods",
    )
    done = wait_status(portal, run_id, {"succeeded", "failed", "cancelled"}, 1500)
    TIMINGS["three client Pods (submit to succeeded)"] = time.monotonic() - began
    log = kubectl(cluster, "-n", release.namespace, "logs", runner.metadata.name, check=False)
    assert done["status"] == "succeeded", f"{done.get('failure_reason')}\n{log[-3000:]}"
    for pod in loadgens:
        (owner,) = pod.metadata.owner_references
        assert (owner.kind, owner.uid) == ("Pod", runner.metadata.uid)
        (container,) = pod.spec.containers
        assert container.command[:3] == ["python", "-m", "runners.podclient"]
        assert container.resources.requests == {"cpu": "100m", "memory": "1Gi"}
    (m,) = portal.request("GET", f"/api/v1/runs/{run_id}/result")["measurements"]
    assert m["status"] == "succeeded", m["error"]
    assert m["metrics"]["completed"] == 6
    assert [c["num_prompts"] for c in m["raw"]["clients"]] == [2, 2, 2]
    # The merged percentiles are those of the union of the three clients' samples.
    detail = m["detail"]
    ok = [i for i, e in enumerate(detail["errors"]) if not e]
    assert len(ok) == 6, detail["errors"]
    for name, key in (("ttft", "ttfts"), ("e2el", "latencies")):
        values = [detail[key][i] for i in ok]
        for p in (50, 99):
            want = float(np.percentile(values, p)) * 1000
            assert m["metrics"][f"p{p}_{name}_ms"] == pytest.approx(want), (name, p)
    clients = m["conditions"]["clients"]
    assert [c["requests"] for c in clients] == [2, 2, 2]
    assert all(
        c["cores"].startswith("Pod ") and c["cores"].endswith(" on sb-node") for c in clients
    )
    assert m["conditions"]["client_placement"].startswith("each client in a Pod of its own")
    # Released together by the rendezvous (one node: one clock), and all gone after.
    # Nobody before the common start time, most within a few wake-ups of it (a starved
    # Pod would be reported late), and the skew is the spread of their own lateness.
    skew = m["conditions"]["client_skew"]
    late = sorted(c["start_late_ms"] for c in clients)
    assert late[0] >= 0 and late[1] < 200, (skew, clients)
    assert skew["release_ms"] == pytest.approx(late[-1] - late[0], abs=0.01), (skew, clients)
    print(f"three client Pods: skew {skew}, placement {m['conditions']['client_placement']}")
    wait_for(lambda: not by_component("loadgen"), 120, "the client Pods to be deleted")
    # Pods came and went: the node's address kept its MAC, so no Pod lost the API server
    # or the web while its ARP entry was stale.
    assert bridge_mac() == BRIDGE_MAC


def test_cancelling_a_run_removes_its_pod(cluster: Cluster, release: Release, portal: Portal):
    created = portal.request("POST", "/api/v1/runs/", {"spec": tiny_spec(release)})
    run_id = created["id"]
    wait_for(
        lambda: any(p.status.phase == "Running" for p in runner_pods(cluster, release, run_id)),
        300,
        "the runner's Pod to run",
        interval=1,
    )
    began = time.monotonic()
    portal.request("POST", f"/api/v1/runs/{run_id}/cancel", {})
    wait_for(lambda: not runner_pods(cluster, release, run_id), 120, "the Pod to be gone", 1)
    TIMINGS["cancel (to Pod gone)"] = time.monotonic() - began
    assert wait_status(portal, run_id, {"cancelled", "failed", "succeeded"}, 60)["status"] == (
        "cancelled"
    )
    # containerd runs nothing of it any more.
    tasks = cluster.ctr("tasks", "ls")
    assert "RUNNING" not in "".join(line for line in tasks.splitlines() if run_id[:8] in line)


@pytest.fixture(scope="module")
def oom_run(cluster: Cluster, release: Release, portal: Portal) -> dict[str, Any]:
    """A tiny run under a 160Mi memory limit, finished (the kernel kills inside its Pod)."""
    began = time.monotonic()
    created = portal.request("POST", "/api/v1/runs/", {"spec": tiny_spec(release, memory="160Mi")})
    done = wait_status(portal, created["id"], {"succeeded", "failed", "cancelled"}, 600)
    TIMINGS["oom run (submit to failed)"] = time.monotonic() - began
    return done


def test_a_runner_over_its_memory_limit_fails_the_run(
    cluster: Cluster, release: Release, oom_run: dict[str, Any]
):
    assert oom_run["status"] == "failed", oom_run
    reason = oom_run["failure_reason"]
    # The kernel's OOM killer, inside the Pod's memory cgroup, killed the processes the
    # runner started (HF baseline, vLLM server): SIGKILL, -9.
    assert "code -9" in reason, reason
    pod = wait_for(
        lambda: next(
            (p for p in runner_pods(cluster, release, oom_run["id"])
             if p.status.phase in ("Succeeded", "Failed")),
            None,
        ),
        120,
        "the runner's Pod to end",
    )  # fmt: skip
    (status,) = pod.status.container_statuses
    assert pod.spec.containers[0].resources.limits["memory"] == "160Mi"
    # containerd saw the OOM kill in the container's cgroup and says so.
    assert status.state.terminated.reason == "OOMKilled", status.state


def test_the_oom_failure_reason_names_the_memory_limit(oom_run: dict[str, Any]):
    """The runner reads its memory cgroup's oom_kill counter (runners.procs.oom_cause): its
    children's -9 becomes 'out of memory' with the limit, at the top of the run's page."""
    assert "out of memory" in oom_run["failure_reason"], oom_run["failure_reason"]
    assert "160Mi" in oom_run["failure_reason"]
