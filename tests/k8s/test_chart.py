"""The Helm chart, offline: lint, render, validate against Kubernetes 1.37's schemas, and
check the behaviour the chart promises (one beat, migrations hook, least privilege, roll
on settings change, samples kept on a volume or in S3, runner and samples settings that
the portal's settings really accept)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from k8s_support import (
    CHART,
    REPO,
    VALUES_EVERYTHING,
    index,
    render_chart,
    run_tool,
    validation_errors,
)

DEFAULT_KINDS = {
    ("ServiceAccount", "servebench"),
    ("Secret", "servebench"),
    ("ConfigMap", "servebench"),
    ("Role", "servebench-runner-jobs"),
    ("RoleBinding", "servebench-runner-jobs"),
    ("ServiceAccount", "servebench-runner"),
    ("Role", "servebench-runner-servers"),
    ("RoleBinding", "servebench-runner-servers"),
    ("Service", "servebench-web"),
    ("Deployment", "servebench-web"),
    ("Deployment", "servebench-worker"),
    ("Deployment", "servebench-beat"),
    ("Secret", "servebench-migrations"),
    ("Job", "servebench-migrate"),
    ("PersistentVolumeClaim", "servebench-samples"),
}
S3_VALUES = [
    "--set", "samples.storage=s3",
    "--set", "samples.s3.bucket=bench-samples",
    "--set", "samples.s3.endpointUrl=https://minio.example.com:9000",
    "--set", "samples.s3.region=eu-west-1",
    "--set", "samples.s3.prefix=servebench/prod",
    "--set", "secrets.awsAccessKeyId=AKIAEXAMPLEKEYID",
    "--set", "secrets.awsSecretAccessKey=example/secret+access/key",
]  # fmt: skip
# On the web pods that mount the samples volume.
SAMPLES_LABEL = "servebench.dev/samples-volume"


def container(doc: dict[str, Any]) -> dict[str, Any]:
    (only,) = doc["spec"]["template"]["spec"]["containers"]
    return only


def volumes(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's volumes by name."""
    return {v["name"]: v for v in doc["spec"]["template"]["spec"].get("volumes", [])}


def mounts(doc: dict[str, Any]) -> dict[str, str]:
    """The container's volume mounts, name -> path."""
    return {m["name"]: m["mountPath"] for m in container(doc).get("volumeMounts", [])}


def run_with_settings(config: dict[str, str], code: str, **extra: str) -> dict[str, Any]:
    """``code`` in a fresh process whose environment is ``config`` (a rendered ConfigMap)
    plus the portal's required secrets: portal/settings.py reads it as a pod would. The
    code prints one JSON document."""
    env = dict(os.environ)
    env.update(config)
    env.update(
        SECRET_KEY="s" * 50,
        DATABASE_URL="postgres://u:p@db.example.com:5432/servebench",
        REDIS_URL="redis://redis.example.com:6379/0",
        DJANGO_SETTINGS_MODULE="portal.settings",
        **extra,
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "values", [[], ["-f", str(VALUES_EVERYTHING)]], ids=["defaults", "everything"]
)
def test_the_chart_lints_strictly(helm, values):
    result = run_tool([helm, "lint", "--strict", str(CHART), *values])
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_the_defaults_render_valid_objects(helm):
    docs = render_chart(helm)
    assert set(index(docs)) == DEFAULT_KINDS
    assert validation_errors(docs) == []


def test_everything_on_renders_valid_objects(helm):
    docs = render_chart(helm, "-f", str(VALUES_EVERYTHING))
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {
        ("ServiceAccount", "servebench-portal"),
        ("ConfigMap", "bench"),
        ("Role", "bench-runner-jobs"),
        ("RoleBinding", "bench-runner-jobs"),
        ("Role", "bench-runner-servers"),  # bound to runner.serviceAccountName, not created
        ("RoleBinding", "bench-runner-servers"),
        ("Service", "bench-web"),
        ("Ingress", "bench"),
        ("PersistentVolumeClaim", "bench-hf-cache"),
        ("Deployment", "bench-web"),
        ("Deployment", "bench-worker"),
        ("Deployment", "bench-beat"),
        ("Job", "bench-migrate"),
    }  # no Secret: existingSecret
    assert validation_errors(docs) == []
    objects = index(docs)
    ingress = objects[("Ingress", "bench")]["spec"]
    assert ingress["ingressClassName"] == "nginx"
    assert ingress["rules"][0]["host"] == "bench.example.com"
    assert ingress["tls"] == [{"secretName": "bench-tls", "hosts": ["bench.example.com"]}]
    # Role and PVC where the runner Jobs go; the binding names the portal's account.
    assert objects[("Role", "bench-runner-jobs")]["metadata"]["namespace"] == "servebench-runs"
    binding = objects[("RoleBinding", "bench-runner-jobs")]
    assert binding["metadata"]["namespace"] == "servebench-runs"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "servebench-portal", "namespace": "servebench"}
    ]
    pvc = objects[("PersistentVolumeClaim", "bench-hf-cache")]
    assert pvc["metadata"]["namespace"] == "servebench-runs"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "2Ti"
    for name in ("bench-web", "bench-worker", "bench-beat"):
        spec = objects[("Deployment", name)]["spec"]["template"]["spec"]
        assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
        assert {"secretRef": {"name": "servebench-credentials"}} in container(
            objects[("Deployment", name)]
        )["envFrom"]
    # Samples in S3: no volume, and web.affinity exactly as given (no one-node rule).
    web = objects[("Deployment", "bench-web")]
    assert set(volumes(web)) == {"tmp"} and set(mounts(web)) == {"tmp"}
    assert web["spec"]["template"]["spec"]["affinity"] == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "web"}},
                    },
                }
            ]
        }
    }


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("web.replica=2", "additional properties 'replica' not allowed"),
        ("beat.replicas=2", "additional properties 'replicas' not allowed"),
        ("runner.resources.memory=lots", "'lots' does not match pattern"),
        ("publicUrl=bench.example.com", "does not match pattern"),
        ("secrets.databaseUrl=mysql://db/x", "does not match pattern"),
        ("samples.storage=S3", "at '/samples/storage': value must be one of 'filesystem', 's3'"),
        ("samples.s3.buckets=x", "additional properties 'buckets' not allowed"),
        ("samples.storage=s3", "at '/samples/s3/bucket': minLength"),  # no bucket
        ("samples.s3.bucket=s3://bench/samples", "at '/samples/s3/bucket': 's3://bench"),
        ("samples.s3.endpointUrl=minio:9000", "at '/samples/s3/endpointUrl'"),
        ("samples.s3.prefix=/servebench/", "at '/samples/s3/prefix'"),
        # filesystem with neither a claim nor one to create: the pods' disk would lose them
        ("samples.persistence.create=false", "at '/samples/persistence': 'anyOf' failed"),
        ("samples.persistence.accessModes={ReadOnlyMany}", "value must be one of"),
        ("samples.persistence.accessModes=null", "missing property 'accessModes'"),
        ("samples.persistence.size=lots", "at '/samples/persistence/size': 'lots'"),
        ("samples.persistence.mountPath=samples", "at '/samples/persistence/mountPath'"),
        ("samples.persistence.mountPath=/tmp", "at '/samples/persistence/mountPath'"),
        ("secrets.awsAccessKeyId=AKIA0", "at '/secrets/awsSecretAccessKey': minLength"),
        ("secrets.awsSecretAccessKey=x", "at '/secrets/awsAccessKeyId': minLength"),
    ],
)
def test_the_schema_rejects_bad_values_naming_them(helm, value, complaint):
    result = run_tool([helm, "template", "x", str(CHART), "--set", value], check=False)
    assert result.returncode != 0
    assert complaint in result.stderr


def test_beat_is_exactly_one_pod_replaced_not_rolled(helm):
    beat = index(render_chart(helm))[("Deployment", "servebench-beat")]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert container(beat)["command"][:4] == ["celery", "-A", "portal.celery", "beat"]
    assert beat["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_migrations_are_a_hook_with_the_portals_settings(helm):
    objects = index(render_chart(helm))
    job = objects[("Job", "servebench-migrate")]
    secret = objects[("Secret", "servebench-migrations")]
    hooks = job["metadata"]["annotations"]
    assert hooks["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        hooks["helm.sh/hook-weight"]
    )
    assert "hook-succeeded" in secret["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod  # the release's account does not exist yet
    migrate = container(job)
    assert migrate["command"] == ["python", "manage.py", "migrate", "--noinput"]
    # The same settings the ConfigMap gives the other pods, and a copy of the same secrets.
    env = {e["name"]: e["value"] for e in migrate["env"]}
    assert env == objects[("ConfigMap", "servebench")]["data"]
    assert migrate["envFrom"] == [{"secretRef": {"name": "servebench-migrations"}}]
    assert set(secret["data"]) == set(objects[("Secret", "servebench")]["data"])


def test_the_portal_role_is_least_privilege(helm):
    objects = index(render_chart(helm))
    rules = objects[("Role", "servebench-runner-jobs")]["rules"]
    assert rules == [
        {
            "apiGroups": ["batch"],
            "resources": ["jobs"],
            "verbs": ["create", "get", "list", "watch", "patch", "delete"],
        },
        {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "patch"]},
    ]
    for name, mounts_token in (("web", True), ("worker", True), ("beat", False)):
        pod = objects[("Deployment", f"servebench-{name}")]["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "servebench"
        assert pod.get("automountServiceAccountToken", True) is mounts_token
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container(objects[("Deployment", f"servebench-{name}")])["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }


def test_runner_pods_get_an_identity_allowed_only_their_server_pods(helm):
    """Servers apart (the default): a runner ServiceAccount whose Role manages Pods and
    reads their logs in the runner namespace, nothing more; same-pod: no such identity."""
    objects = index(render_chart(helm))
    config = objects[("ConfigMap", "servebench")]["data"]
    assert config["SERVEBENCH_K8S_SERVER_PLACEMENT"] == "separate"
    assert config["SERVEBENCH_K8S_RUNNER_SERVICE_ACCOUNT"] == "servebench-runner"
    assert objects[("ServiceAccount", "servebench-runner")]["automountServiceAccountToken"] is False
    assert objects[("Role", "servebench-runner-servers")]["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["create", "get", "list", "watch", "delete"],
        },
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    ]
    assert objects[("RoleBinding", "servebench-runner-servers")]["subjects"] == [
        {"kind": "ServiceAccount", "name": "servebench-runner", "namespace": "servebench"}
    ]
    same = index(render_chart(helm, "--set", "runner.serverPlacement=same-pod"))
    assert ("Role", "servebench-runner-servers") not in same
    assert ("ServiceAccount", "servebench-runner") not in same
    assert same[("ConfigMap", "servebench")]["data"]["SERVEBENCH_K8S_RUNNER_SERVICE_ACCOUNT"] == ""
    own = index(render_chart(helm, "--set", "runner.serviceAccountName=mine"))
    assert ("ServiceAccount", "servebench-runner") not in own  # bound, not created
    assert own[("RoleBinding", "servebench-runner-servers")]["subjects"][0]["name"] == "mine"


def test_a_settings_change_rolls_the_pods(helm):
    def checksums(*args: str) -> dict[str, str]:
        web = index(render_chart(helm, *args))[("Deployment", "servebench-web")]
        return web["spec"]["template"]["metadata"]["annotations"]

    base = checksums()
    assert checksums() == base  # stable: a re-render changes nothing
    config = checksums("--set", "publicUrl=https://bench.example.com")
    assert config["checksum/config"] != base["checksum/config"]
    assert config["checksum/secret"] == base["checksum/secret"]
    secret = checksums("--set", "secrets.databaseUrl=postgres://u:p@db/x")
    assert secret["checksum/secret"] != base["checksum/secret"]


def test_probes_ask_healthz_with_a_host_django_accepts(helm):
    objects = index(render_chart(helm))
    web = container(objects[("Deployment", "servebench-web")])
    allowed = objects[("ConfigMap", "servebench")]["data"]["ALLOWED_HOSTS"].split(",")
    for probe in ("startupProbe", "readinessProbe"):
        get = web[probe]["httpGet"]
        assert get["path"] == "/healthz"
        (host,) = [h["value"] for h in get["httpHeaders"] if h["name"] == "Host"]
        assert host in allowed
    assert "tcpSocket" in web["livenessProbe"]  # a database outage restarts nothing
    worker = container(objects[("Deployment", "servebench-worker")])
    assert "inspect ping" in " ".join(worker["livenessProbe"]["exec"]["command"])


def test_the_runner_values_are_settings_the_portal_accepts(helm, tmp_path):
    """The ConfigMap, read by portal/settings.py in a fresh process, and the Job the
    executor would build from it, validated like the chart's own objects."""
    objects = index(render_chart(helm, "-f", str(VALUES_EVERYTHING)))
    code = """
import json, django
django.setup()
from django.conf import settings
from portal.dispatch import kubejob
cfg = kubejob.RunnerConfig.from_settings()
resources = {"gpu_count": 2, "gpu_type": "H100", "timeout_minutes": 30}
spec = {"model": {"id": "m"}, "resources": resources}
job = kubejob.build_job("abcdefghij0123456789", spec, "https://x/api/v1/runner/runs/a", cfg)
names = [n for n in dir(settings) if n.startswith("SERVEBENCH_K8S_")]
names += ["SERVEBENCH_GPU_TYPES", "SERVEBENCH_MODEL_ROOTS", "SERVEBENCH_DATASET_ROOTS"]
print(json.dumps({"settings": {n: getattr(settings, n) for n in names},
                  "job": kubejob.to_manifest(job)}))
"""
    out = run_with_settings(objects[("ConfigMap", "bench")]["data"], code)
    s = out["settings"]
    assert s["SERVEBENCH_K8S_NAMESPACE"] == "servebench-runs"
    assert (
        s["SERVEBENCH_K8S_RUNNER_IMAGE"]
        == "registry.example.com/servebench-runner:0.1.0-vllm0.32.0"
    )
    assert s["SERVEBENCH_K8S_IMAGE_PULL_SECRETS"] == ["registry-credentials", "other-registry"]
    assert s["SERVEBENCH_K8S_TOLERATIONS"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert s["SERVEBENCH_K8S_NODE_SELECTOR"] == {"pool": "gpu"}
    assert s["SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS"] == ["topology.kubernetes.io/zone"]
    assert s["SERVEBENCH_GPU_TYPES"] == ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"]
    assert s["SERVEBENCH_MODEL_ROOTS"] == ["/models"]
    assert s["SERVEBENCH_DATASET_ROOTS"] == ["/datasets"]
    assert s["SERVEBENCH_K8S_HF_CACHE_PVC"] == "bench-hf-cache"
    assert s["SERVEBENCH_K8S_HF_HOME"] == "/models/hf"
    assert s["SERVEBENCH_K8S_MAX_GPUS"] == 8
    assert s["SERVEBENCH_K8S_REPORT_URL"] == "https://bench.example.com"
    assert s["SERVEBENCH_K8S_START_GRACE_SECONDS"] == 300
    job = out["job"]
    assert validation_errors([job]) == []
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu", "servebench.dev/gpu-type": "H100"}
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}, {"name": "other-registry"}]
    assert pod["serviceAccountName"] == "servebench-runner"
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits == {"memory": "128Gi", "nvidia.com/gpu": "2"}
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600


def test_by_default_samples_live_on_a_volume_of_the_web_pods(helm):
    """Not on a pod's own disk (lost on restart, split between replicas): a PVC the chart
    creates and keeps, mounted where SERVEBENCH_SAMPLES_DIR points, in the web pods only."""
    objects = index(render_chart(helm))
    config = objects[("ConfigMap", "servebench")]["data"]
    assert config["SERVEBENCH_SAMPLES_STORAGE"] == "filesystem"
    assert config["SERVEBENCH_SAMPLES_DIR"] == "/var/lib/servebench"
    assert not [k for k in config if k.startswith("SERVEBENCH_S3_")]
    pvc = objects[("PersistentVolumeClaim", "servebench-samples")]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert "storageClassName" not in pvc["spec"]  # the cluster's default class
    web = objects[("Deployment", "servebench-web")]
    assert volumes(web)["samples"] == {
        "name": "samples",
        "persistentVolumeClaim": {"claimName": "servebench-samples"},
    }
    assert mounts(web) == {"tmp": "/tmp", "samples": config["SERVEBENCH_SAMPLES_DIR"]}
    # Writable by the non-root uid on a read-only root filesystem: the volume is group-owned.
    pod = web["spec"]["template"]["spec"]
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"] == 10001
    assert container(web)["securityContext"]["readOnlyRootFilesystem"] is True
    # ReadWriteOnce attaches to one node: the web pods that mount it are kept together (web
    # pods of an older release, without the volume, may be anywhere: they do not count).
    assert web["spec"]["template"]["metadata"]["labels"][SAMPLES_LABEL] == "true"
    selector = {**web["spec"]["selector"]["matchLabels"], SAMPLES_LABEL: "true"}
    assert pod["affinity"] == {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": selector},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    # The worker, beat and migrations never touch samples.
    for key in (("Deployment", "servebench-worker"), ("Deployment", "servebench-beat")):
        assert set(volumes(objects[key])) == {"tmp"}
        assert "affinity" not in objects[key]["spec"]["template"]["spec"]
    assert "samples" not in volumes(objects[("Job", "servebench-migrate")])


def test_an_existing_readwritemany_claim_is_mounted_without_keeping_pods_together(helm):
    shared = [
        "--set", "samples.persistence.existingClaim=shared-samples",
        "--set", "samples.persistence.accessModes={ReadWriteMany}",
        "--set", "samples.persistence.mountPath=/data/samples",
    ]  # fmt: skip
    objects = index(render_chart(helm, *shared))
    assert ("PersistentVolumeClaim", "servebench-samples") not in objects
    web = objects[("Deployment", "servebench-web")]
    assert volumes(web)["samples"]["persistentVolumeClaim"] == {"claimName": "shared-samples"}
    assert mounts(web)["samples"] == "/data/samples"
    assert objects[("ConfigMap", "servebench")]["data"]["SERVEBENCH_SAMPLES_DIR"] == "/data/samples"
    assert "affinity" not in web["spec"]["template"]["spec"]


def test_the_one_node_rule_adds_to_the_web_affinity_given(helm):
    objects = index(
        render_chart(helm, "-f", str(VALUES_EVERYTHING), "--set", "samples.storage=filesystem")
    )
    assert validation_errors(list(objects.values())) == []
    web = objects[("Deployment", "bench-web")]
    assert volumes(web)["samples"]["persistentVolumeClaim"] == {"claimName": "unused-in-s3"}
    affinity = web["spec"]["template"]["spec"]["affinity"]
    assert set(affinity) == {"podAntiAffinity", "podAffinity"}  # the values' own, kept
    (term,) = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    selector = web["spec"]["selector"]["matchLabels"]
    assert term["labelSelector"]["matchLabels"] == {**selector, SAMPLES_LABEL: "true"}
    assert term["topologyKey"] == "kubernetes.io/hostname"


def test_s3_samples_render_settings_and_keep_the_keys_in_the_secret(helm):
    objects = index(render_chart(helm, *S3_VALUES))
    assert validation_errors(list(objects.values())) == []
    config = objects[("ConfigMap", "servebench")]["data"]
    samples = {k: v for k, v in config.items() if "SAMPLES" in k or "S3" in k}
    assert samples == {
        "SERVEBENCH_SAMPLES_STORAGE": "s3",
        "SERVEBENCH_S3_BUCKET": "bench-samples",
        "SERVEBENCH_S3_ENDPOINT_URL": "https://minio.example.com:9000",
        "SERVEBENCH_S3_REGION": "eu-west-1",
        "SERVEBENCH_S3_PREFIX": "servebench/prod",
    }
    # The keys are in the Secrets (the release's and the migration hook's copy), never in
    # the settings that the ConfigMap and the hook's plain env carry.
    migrate_env = container(objects[("Job", "servebench-migrate")])["env"]
    plain = json.dumps([config, migrate_env])
    assert "AKIAEXAMPLEKEYID" not in plain and "example/secret" not in plain
    assert "AWS_" not in plain
    for name in ("servebench", "servebench-migrations"):
        data = objects[("Secret", name)]["data"]
        assert base64.b64decode(data["AWS_ACCESS_KEY_ID"]).decode() == "AKIAEXAMPLEKEYID"
        assert base64.b64decode(data["AWS_SECRET_ACCESS_KEY"]).decode() == (
            "example/secret+access/key"
        )
    # No volume, no one-node rule.
    assert not [key for key in objects if key[0] == "PersistentVolumeClaim"]
    web = objects[("Deployment", "servebench-web")]
    assert set(volumes(web)) == {"tmp"}
    assert "affinity" not in web["spec"]["template"]["spec"]
    assert SAMPLES_LABEL not in web["spec"]["template"]["metadata"]["labels"]

    # Rotating a key rolls the pods; without keys the Secret has none (the pods' role).
    def annotations(*args: str) -> dict[str, str]:
        doc = index(render_chart(helm, *args))[("Deployment", "servebench-web")]
        return doc["spec"]["template"]["metadata"]["annotations"]

    rotated = annotations(*S3_VALUES, "--set", "secrets.awsSecretAccessKey=rotated")
    assert rotated["checksum/secret"] != annotations(*S3_VALUES)["checksum/secret"]
    role_only = index(render_chart(helm, *S3_VALUES[:10]))
    assert not [k for k in role_only[("Secret", "servebench")]["data"] if k.startswith("AWS_")]


SAMPLES_CODE = """
import json, django
django.setup()
from django.conf import settings
from django.core.files.storage import storages
store = storages["samples"]
names = ("location", "bucket_name", "endpoint_url", "region_name", "access_key", "secret_key")
print(json.dumps({"kind": settings.SERVEBENCH_SAMPLES_STORAGE,
                  "backend": type(store).__module__ + "." + type(store).__name__,
                  **{n: getattr(store, n) for n in names if hasattr(store, n)}}))
"""


def test_the_samples_values_are_settings_the_portal_accepts(helm):
    """portal/settings.py, in a fresh process, builds the 'samples' storage from the
    rendered ConfigMap (and, for S3, the Secret's keys as envFrom would give them)."""
    default = index(render_chart(helm))
    web = default[("Deployment", "servebench-web")]
    out = run_with_settings(default[("ConfigMap", "servebench")]["data"], SAMPLES_CODE)
    assert out["kind"] == "filesystem"
    assert out["backend"] == "django.core.files.storage.filesystem.FileSystemStorage"
    assert out["location"] == mounts(web)["samples"]

    s3 = index(render_chart(helm, *S3_VALUES))
    secret = {
        k: base64.b64decode(v).decode()
        for k, v in s3[("Secret", "servebench")]["data"].items()
        if k.startswith("AWS_")
    }
    out = run_with_settings(s3[("ConfigMap", "servebench")]["data"], SAMPLES_CODE, **secret)
    assert out == {
        "kind": "s3",
        "backend": "storages.backends.s3.S3Storage",
        "location": "servebench/prod",
        "bucket_name": "bench-samples",
        "endpoint_url": "https://minio.example.com:9000",
        "region_name": "eu-west-1",
        "access_key": "AKIAEXAMPLEKEYID",
        "secret_key": "example/secret+access/key",
    }

    # The pods' role: no keys at all (an existingSecret without the AWS_* keys).
    everything = index(render_chart(helm, "-f", str(VALUES_EVERYTHING)))
    out = run_with_settings(everything[("ConfigMap", "bench")]["data"], SAMPLES_CODE)
    assert out["bucket_name"] == "servebench-samples" and out["location"] == "servebench/prod"
    assert out["access_key"] is None and out["secret_key"] is None
