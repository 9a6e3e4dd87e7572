"""One fingerprint everywhere: the runner's result document, Run.fingerprint,
Environment.fingerprint, baselines (latest:<label>) and history agree, and the data
migration brings stored fingerprints to the one definition."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import webdata
from django.apps import apps

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.benchmarks import baselines, documents, history, intake
from portal.benchmarks.models import Environment, Run, RunStatus
from runners import fingerprint as rf
from runners.report import Reporter
from runners.runner import Runner
from runners.spec import Spec, tiny_demo


def _variant(spec: dict[str, Any], backends: list[dict[str, Any]]) -> dict[str, Any]:
    return {**spec, "backends": backends}


@pytest.mark.django_db(transaction=True)
def test_the_runner_document_the_run_and_its_environment_agree(
    live_server: Any, make_user: Any, tiny_model: Path, tmp_path: Path
) -> None:
    owner = make_user("alice")
    spec = tiny_demo(str(tiny_model))
    run = intake.create_run(owner, spec.model_dump(mode="json"))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.DISPATCHED)
    token = issue_token(owner, kind=ApiToken.Kind.RUN, run=run).plaintext
    url = f"{live_server.url}/api/v1/runner/runs/{run.public_id}"
    out = tmp_path / "result.json"
    runner = Runner(spec, workdir=tmp_path, out=out, reporter=Reporter(url, token))
    runner._environment()  # the runner's first phase: capture, write, report
    document = json.loads(out.read_text())
    run.refresh_from_db()
    environment = Environment.objects.get(run=run)
    assert len(document["fingerprint"]) == 64
    assert document["fingerprint"] == run.fingerprint == environment.fingerprint
    assert documents.result_document(run)["fingerprint"] == run.fingerprint
    # Until the runner reported, the portal's value used the spec alone.
    assert rf.fingerprint(spec) != run.fingerprint  # the revision became the content hash


@pytest.mark.django_db
def test_backend_order_and_startup_timeout_keep_the_series_and_dtype_leaves_it(
    make_user: Any,
) -> None:
    owner = make_user("alice")
    base = webdata.sweep_spec([1, 4])
    hf, vllm = base["backends"]
    reordered = _variant(base, [{**vllm, "startup_timeout_s": 60}, hf])
    other_dtype = {**base, "model": {**base["model"], "dtype": "float16"}}
    runs = [
        webdata.make_sweep_run(owner, [1, 4], spec=spec, seed=i)
        for i, spec in enumerate([base, base, reordered, other_dtype])
    ]
    first, again, moved, fp16 = runs
    assert first.fingerprint == again.fingerprint == moved.fingerprint != fp16.fingerprint
    for run in runs:
        assert Environment.objects.get(run=run).fingerprint == run.fingerprint
        snapshot = Environment.objects.get(run=run).snapshot
        assert run.fingerprint == rf.fingerprint(Spec.model_validate(run.spec), snapshot)
    # latest:<label> and history follow the same key.
    baselines.mark(first, owner, "main")
    found = baselines.resolve(owner, "latest:main", fingerprint=moved.fingerprint)
    assert found == first
    with pytest.raises(baselines.BaselineError):
        baselines.resolve(owner, "latest:main", fingerprint=fp16.fingerprint)
    series = history.history(owner, moved.fingerprint)
    assert [p.public_id for p in series.points] == [r.public_id for r in (first, again, moved)]


@pytest.mark.django_db
def test_the_data_migration_recomputes_stored_fingerprints(make_user: Any) -> None:
    owner = make_user("alice")
    with_env = webdata.make_sweep_run(owner, [1, 4])
    queued = intake.create_run(owner, webdata.sweep_spec([1]))
    expected = {with_env.pk: with_env.fingerprint, queued.pk: queued.fingerprint}
    Run.objects.update(fingerprint="0" * 64)  # as an older definition left them
    Environment.objects.update(fingerprint="1" * 64)
    migration = importlib.import_module("portal.benchmarks.migrations.0005_one_fingerprint")
    migration.recompute(apps, None)
    for pk, value in expected.items():
        assert Run.objects.get(pk=pk).fingerprint == value
    assert Environment.objects.get(run_id=with_env.pk).fingerprint == expected[with_env.pk]
