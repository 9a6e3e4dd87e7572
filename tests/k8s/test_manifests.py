"""The plain manifests (k8s/, kustomize), offline: they build, validate against Kubernetes
1.37's schemas, and deploy the same thing as the Helm chart's defaults."""

from __future__ import annotations

import copy
from typing import Any

from k8s_support import index, render_chart, render_kustomize, validation_errors

# Labels only one of the two tools adds.
TOOL_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/version"}


def normalized(doc: dict[str, Any]) -> dict[str, Any]:
    """The object without what says which tool made it (labels, checksums, namespace)."""
    doc = copy.deepcopy(doc)
    metas = [doc["metadata"]]
    template = doc.get("spec", {}).get("template")
    if template:
        metas.append(template["metadata"])
    for meta in metas:
        meta.pop("annotations", None)
        meta.pop("namespace", None)
        labels = {k: v for k, v in meta.get("labels", {}).items() if k not in TOOL_LABELS}
        meta["labels"] = labels
    return doc


def test_the_manifests_build_and_validate(kubectl):
    docs = render_kustomize(kubectl)
    assert validation_errors(docs) == []
    assert {d["metadata"]["namespace"] for d in docs} == {"servebench"}
    assert set(index(docs)) == {
        ("ServiceAccount", "servebench"),
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
        ("Job", "servebench-migrate"),
        ("PersistentVolumeClaim", "servebench-samples"),
    }


def test_the_manifests_deploy_what_the_chart_deploys_by_default(helm, kubectl):
    chart = index(render_chart(helm, release="servebench", namespace="servebench"))
    plain = index(render_kustomize(kubectl))
    # The chart's Secrets are the user's own in k8s/ (created with kubectl, see its README).
    assert set(chart) - set(plain) == {
        ("Secret", "servebench"),
        ("Secret", "servebench-migrations"),
    }
    for key, doc in plain.items():
        ours, theirs = normalized(doc), normalized(chart[key])
        if key == ("Job", "servebench-migrate"):
            # Not a hook here: it reads the ConfigMap and Secret like the other pods (the
            # chart's hook runs before they exist) and cleans itself up.
            assert ours["spec"].pop("ttlSecondsAfterFinished") == 600
            mine = ours["spec"]["template"]["spec"]["containers"][0]
            chart_job = theirs["spec"]["template"]["spec"]["containers"][0]
            assert mine.pop("envFrom") == [
                {"configMapRef": {"name": "servebench"}},
                {"secretRef": {"name": "servebench"}},
            ]
            chart_job.pop("envFrom"), chart_job.pop("env")
        assert ours == theirs, f"{key} differs from the chart's"
