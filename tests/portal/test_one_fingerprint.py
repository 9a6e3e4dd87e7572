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
    assert run.config_fingerprint == rf.configuration_fingerprint(spec, document["environment"])
    # Until the runner reported, the portal's values used the spec alone: the measurement
    # is the same (a CPU run on a CPU), the configuration's revision became the content hash.
    assert rf.fingerprint(spec) == run.fingerprint
    assert rf.configuration_fingerprint(spec) != run.config_fingerprint


@pytest.mark.django_db
def test_backend_order_keeps_the_configuration_and_a_dtype_change_stays_in_the_series(
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
    # One measurement: a dtype change is a change to judge, not another series.
    assert first.fingerprint == again.fingerprint == moved.fingerprint == fp16.fingerprint
    assert first.config_fingerprint == again.config_fingerprint == moved.config_fingerprint
    assert fp16.config_fingerprint != first.config_fingerprint
    for run in runs:
        assert Environment.objects.get(run=run).fingerprint == run.fingerprint
        snapshot = Environment.objects.get(run=run).snapshot
        parsed = Spec.model_validate(run.spec)
        assert run.fingerprint == rf.fingerprint(parsed, snapshot)
        assert run.config_fingerprint == rf.configuration_fingerprint(parsed, snapshot)
    # latest:<label> and history follow the measurement.
    baselines.mark(first, owner, "main")
    assert baselines.resolve(owner, "latest:main", fingerprint=moved.fingerprint) == first
    assert baselines.resolve(owner, "latest:main", fingerprint=fp16.fingerprint) == first
    series = history.history(owner, moved.fingerprint)
    assert [p.public_id for p in series.points] == [r.public_id for r in runs]
    assert series.points[3].changes[0] == "model.dtype: bfloat16 → float16"  # a marker
    assert not any(p.changes for p in series.points[:3])
    # The verdict's noise series is one configuration's: the fp16 run is not in it.
    noise = history.series_runs(
        owner, first.fingerprint, owner.pk, configuration=first.config_fingerprint
    )
    assert fp16.public_id not in [r.public_id for r in noise] and len(noise) == 3


@pytest.mark.django_db
def test_the_data_migration_recomputes_stored_fingerprints(make_user: Any) -> None:
    owner = make_user("alice")
    with_env = webdata.make_sweep_run(owner, [1, 4])
    queued = intake.create_run(owner, webdata.sweep_spec([1]))
    expected = {with_env.pk: with_env.fingerprint, queued.pk: queued.fingerprint}
    Run.objects.update(fingerprint="0" * 64)  # as an older definition left them
    Environment.objects.update(fingerprint="1" * 64)
    configs = {with_env.pk: with_env.config_fingerprint, queued.pk: queued.config_fingerprint}
    Run.objects.update(config_fingerprint="")
    migration = importlib.import_module("portal.benchmarks.migrations.0007_two_identities")
    migration.recompute(apps, None)
    for pk, value in expected.items():
        assert Run.objects.get(pk=pk).fingerprint == value
        assert Run.objects.get(pk=pk).config_fingerprint == configs[pk] != ""
    assert Environment.objects.get(run_id=with_env.pk).fingerprint == expected[with_env.pk]
