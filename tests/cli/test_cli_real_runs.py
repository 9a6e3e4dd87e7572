"""The CLI as a CI job runs it, against the whole stack: a live test server, a real Celery
worker, the local executor and the real runner on the tiny model (HF baseline and a vLLM
server with vLLM's bench client).

A vLLM server start costs ~100 s on 2 CPU cores, so the module makes exactly three real
runs once, the way a pipeline would:

1. ``servebench submit spec.yaml --wait --label main``  (the main branch), then
2. ``servebench submit spec.yaml --wait --compare-to latest:main`` (a pull request that
   changes nothing), then
3. ``servebench submit flag.yaml --wait --compare-to latest:main`` (a pull request that sets
   ``max_num_seqs: 1``, measured five times so its run-to-run noise is known),

as subprocesses, and keeps every row they produced. pytest-django empties the database
after each test that uses the live server, so ``real_runs`` puts those rows back before
each test: every test sees the same two real runs without another benchmark. The whole
stack's end-to-end check (the numbers in the database, the API and the run page) reads
the first of them too, so the suite runs that path once.

The vLLM servers run eager (``enforce_eager``, in every run alike, so no comparison sees
it change): torch.compile's warm-up cost each start 10-30 s on 2 cores, and what this
module checks is the CLI and the stack, not the compiled model (the session's shared
server, ``tests/shared_servers.py``, runs compiled).
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from portal.benchmarks.models import Measurement, Run, RunStatus
from runners.result import ResultDocument
from servebench.compare import compare_documents

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(2400),
]


VLLM = {"kind": "vllm", "enforce_eager": True}  # every run's (see the module docstring)


def real_spec(model: str) -> dict[str, Any]:
    return {
        "name": "servebench CLI on the tiny model",
        "model": {"id": model, "max_model_len": 2048},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 32, "num_warmups": 1},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1, 4]}],
        "backends": [
            {"kind": "hf-sequential", "num_prompts": 4, "num_warmups": 0},
            dict(VLLM),
        ],
        "resources": {"gpu_count": 0, "timeout_minutes": 20},
    }


def flag_spec(model: str) -> dict[str, Any]:
    """The pull request that changes one engine flag: one sequence at a time, so a load of
    4 queues behind it (measured five times: its own run-to-run spread is the noise).
    Without the HF baseline, which the change does not touch: which backends a run has is
    its configuration, not its measurement, so the pair stays comparable.

    Five, not three: with three, one repeat slowed by the busy machine (184 against 310
    and 319 tok/s) widened the t interval (2 degrees of freedom, t = 4.3) across zero, and
    a CI run judged the halved throughput "within noise"; five give t = 2.8 over sqrt(5)."""
    spec = real_spec(model)
    spec["backends"] = [{**VLLM, "max_num_seqs": 1}]
    spec["repeats"] = 5
    return spec


@dataclass
class Invocation:
    argv: list[str]
    code: int
    out: str
    err: str

    def explain(self) -> str:
        return f"$ servebench {' '.join(self.argv)}\nexit {self.code}\n{self.out}\n{self.err}"


@dataclass
class RealRuns:
    url: str
    token: str
    workdir: Path
    worker_log: Path
    first: Invocation | None = None
    second: Invocation | None = None
    flag: Invocation | None = None
    snapshot: str = ""
    ids: list[str] = field(default_factory=list)  # the first two runs
    flag_id: str = ""

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SERVEBENCH_URL": self.url,
            "SERVEBENCH_TOKEN": self.token,
            "PYTHONPATH": str(REPO),
        }

    def cli(self, *argv: str) -> Invocation:
        return run_cli(list(argv), self.env(), self.workdir)


def run_cli(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 1500) -> Invocation:
    """``python -m servebench ARGV`` as a separate process, as CI runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "servebench", *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    return Invocation(argv, done.returncode, done.stdout, done.stderr)


def snapshot() -> str:
    """Every row the runs produced, as Django's JSON serialization."""
    from django.contrib.auth import get_user_model
    from django.core import serializers

    from portal.accounts.models import ApiToken
    from portal.benchmarks.models import Baseline, Environment

    rows: list[Any] = []
    for model in (get_user_model(), ApiToken, Run, Measurement, Environment, Baseline):
        rows.extend(model.objects.all())
    return serializers.serialize("json", rows)


@pytest.fixture(scope="module")
def real(
    django_db_setup: None,
    django_db_blocker: Any,
    live_server: Any,
    tiny_model: Path,
    have_vllm: None,
    tmp_path_factory: pytest.TempPathFactory,
    module_worker: Any,
) -> RealRuns:
    """The two real runs, made once for the module through the CLI (see module doc). The
    worker stays up for the module: ``test_a_run_that_fails...`` submits one more."""
    workdir = tmp_path_factory.mktemp("cli-real")
    (workdir / "spec.yaml").write_text(yaml.safe_dump(real_spec(str(tiny_model))))
    (workdir / "flag.yaml").write_text(yaml.safe_dump(flag_spec(str(tiny_model))))
    # What pytest-django does around each live-server test: the server's host allowed.
    live_server._live_server_modified_settings.enable()
    try:
        return _make_real_runs(django_db_blocker, live_server, module_worker, workdir)
    finally:
        live_server._live_server_modified_settings.disable()


def _make_real_runs(
    django_db_blocker: Any, live_server: Any, module_worker: Any, workdir: Path
) -> RealRuns:
    with django_db_blocker.unblock():
        from django.contrib.auth import get_user_model

        from portal.accounts.tokens import create_user_token

        user = get_user_model().objects.create_user("ci-bot", password="pw-ci-bot")
        real_runs = RealRuns(
            live_server.url,
            create_user_token(user, "ci").plaintext,
            workdir,
            worker_log=workdir / "worker.log",
        )
        module_worker(live_server.url, real_runs.worker_log)
        wait = ["--wait", "--poll", "2s", "--timeout", "20m"]
        real_runs.first = real_runs.cli(
            "submit", "spec.yaml", *wait, "--label", "main", "--summary", "first.md"
        )
        assert real_runs.first.code == 0, (
            real_runs.first.explain() + real_runs.worker_log.read_text()[-3000:]
        )
        real_runs.second = real_runs.cli(
            "submit", "spec.yaml", *wait, "--baseline", "latest:main",
            "--summary", "second.md", "--name", "pull request",
        )  # fmt: skip
        assert real_runs.second.code in (0, 1), real_runs.second.explain()
        real_runs.flag = real_runs.cli(
            "submit", "flag.yaml", *wait, "--baseline", "latest:main",
            "--summary", "flag.md", "--name", "max_num_seqs 1",
        )  # fmt: skip
        *real_runs.ids, real_runs.flag_id = list(
            Run.objects.order_by("created_at").values_list("public_id", flat=True)
        )
        real_runs.snapshot = snapshot()
    return real_runs


@pytest.fixture
def real_runs(real: RealRuns, transactional_db: None) -> RealRuns:
    """The two real runs, their measurements, environment, tokens and baseline mark, back
    in the database if an earlier test's teardown emptied it."""
    if not Run.objects.filter(public_id=real.ids[0]).exists():
        from django.core import serializers
        from django.db import transaction

        with transaction.atomic():  # foreign keys are checked at commit
            for obj in serializers.deserialize("json", real.snapshot):
                obj.save()
    return real


# --------------------------------------------------------------------------- submit --wait


def test_submit_wait_prints_the_permalink_progress_and_a_summary(real_runs):
    first = real_runs.first
    base_id, _ = real_runs.ids
    lines = first.out.splitlines()
    assert lines[0] == f"{real_runs.url}/runs/{base_id}/", first.explain()
    # Progress on stderr: points done of total, ending at 3/3.
    assert "0/3 points done" in first.err or "1/3 points done" in first.err, first.err
    assert f"run {base_id[:8]} succeeded: 3/3 points done" in first.err
    # The summary table: every point, with numbers.
    for label in (
        "hf-sequential",
        "concurrency:max_concurrency=1",
        "concurrency:max_concurrency=4",
    ):
        assert label in first.out
    assert "out tok/s" in first.out and "succeeded" in first.out
    assert f"labelled run {base_id} 'main': latest:main" in first.err
    summary = (real_runs.workdir / "first.md").read_text()
    assert summary.startswith("### servebench:") and "| vllm |" in summary
    run = Run.objects.get(public_id=base_id)
    assert run.status == RunStatus.SUCCEEDED and run.name == "servebench CLI on the tiny model"


def test_submit_with_the_baseline_compares_against_the_previous_run(real_runs):
    second = real_runs.second
    base_id, cand_id = real_runs.ids
    assert second.out.splitlines()[0] == f"{real_runs.url}/runs/{cand_id}/"
    assert f"base       {base_id}" in second.out, second.explain()
    assert f"candidate  {cand_id}" in second.out
    regressed = "WORSE" in second.out
    assert second.code == (1 if regressed else 0), second.explain()
    assert ("verdict: no regression" in second.out) is not regressed
    summary = (real_runs.workdir / "second.md").read_text()
    assert f"/compare/?runs={base_id},{cand_id}&reference={base_id}" in summary
    # 🟡: changes beyond the threshold whose run-to-run noise one repeat cannot measure.
    assert summary.startswith(("### 🔴",) if regressed else ("### 🟢", "### 🟡"))


def test_the_numbers_reach_the_database_the_api_and_the_run_page(real_runs):
    """The whole stack, end to end (API submit -> real Celery worker -> local executor ->
    real runner: HF baseline and a vLLM server with vLLM's bench client -> measurements
    through the live server): the first run's numbers are stored, served by the API to
    its owner only, and shown on its run page. Its own module once made a run of its own
    for this (a vLLM start); the first real run here took the same path."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    base_id, _ = real_runs.ids
    run = Run.objects.get(public_id=base_id)
    assert run.status == RunStatus.SUCCEEDED, run.failure_reason
    rows = {(m.backend, m.point_key): m for m in Measurement.objects.filter(run=run)}
    assert set(rows) == {
        ("hf-sequential", "baseline"),
        ("vllm", "concurrency:max_concurrency=1"),
        ("vllm", "concurrency:max_concurrency=4"),
    }
    for m in rows.values():
        assert m.status == "succeeded", m.error
        assert m.output_throughput > 0 and m.mean_ttft_ms > 0 and m.p99_e2el_ms > 0
    c1 = rows[("vllm", "concurrency:max_concurrency=1")]
    c4 = rows[("vllm", "concurrency:max_concurrency=4")]
    assert (c1.concurrency, c4.concurrency) == (1, 4)
    assert c4.kv_cache_usage_peak is not None  # read from the server's /metrics

    # The API returns the numbers, to the owner only.
    owner = Client()
    owner.force_login(run.owner)
    detail = owner.get(f"/api/v1/runs/{base_id}/").json()
    assert detail["status"] == "succeeded"
    assert detail["progress"] == {"done": 3, "total": 3}
    served = {
        (m["backend"], m["point_key"]): m["output_throughput"] for m in detail["measurements"]
    }
    assert served == {k: m.output_throughput for k, m in rows.items()}
    assert detail["environment"]["vllm_version"]
    doc = ResultDocument.model_validate(owner.get(f"/api/v1/runs/{base_id}/result").json())
    assert doc.status == "succeeded" and len(doc.measurements) == 3
    assert doc.measurements[0].detail  # per-request arrays made it through
    other = Client()
    other.force_login(get_user_model().objects.create_user("outsider", password="pw-outsider"))
    for who in (other, Client()):
        assert who.get(f"/api/v1/runs/{base_id}/").status_code == 404

    # The run page (portal.web) shows them too.
    page = owner.get(f"/runs/{base_id}/")
    assert page.status_code == 200
    html = page.content.decode()
    for m in rows.values():
        assert f"{m.output_throughput:.1f}" in html


# --------------------------------------------------------------------------- results, compare


def test_results_of_a_real_run_in_every_format(real_runs):
    run_id = real_runs.ids[0]
    table = real_runs.cli("results", run_id)
    assert table.code == 0 and "TTFT p99 ms" in table.out
    doc = ResultDocument.model_validate_json(
        real_runs.cli("results", run_id, "--format", "json").out
    )
    assert doc.status == "succeeded" and len(doc.measurements) == 3
    assert all(m.detail.get("ttfts") for m in doc.measurements)
    rows = list(
        csv.DictReader(io.StringIO(real_runs.cli("results", run_id, "--format", "csv").out))
    )
    stored = {
        (m.backend, m.point_key): m for m in Measurement.objects.filter(run__public_id=run_id)
    }
    assert {(r["backend"], r["point"]) for r in rows} == set(stored)
    for row in rows:
        m = stored[(row["backend"], row["point"])]
        assert float(row["output_throughput"]) == m.output_throughput
        assert float(row["p99_ttft_ms"]) == m.p99_ttft_ms


def test_compare_two_real_runs_exits_as_the_verdict_says(real_runs):
    from portal.benchmarks.documents import result_document

    base_id, cand_id = real_runs.ids
    docs = [result_document(Run.objects.get(public_id=i)) for i in (base_id, cand_id)]
    for args, (base, cand) in (((base_id, cand_id), docs), ((cand_id, base_id), docs[::-1])):
        result = real_runs.cli("compare", *args, "--format", "json")
        assert result.code in (0, 1), result.explain()
        body = json.loads(result.out)
        expected = compare_documents(base, cand)
        assert body["regressed"] == expected.regressed
        assert result.code == (1 if expected.regressed else 0)
        assert [p["point"] for p in body["points"]] == [p.key for p in expected.points]
        for point in body["points"]:
            for metric in point["metrics"]:
                assert metric["method"] != "none", metric
    markdown = real_runs.cli("compare", base_id, cand_id, "--markdown", "--metric", "p99_itl_ms")
    assert "| point | metric |" in markdown.out and "How the verdict was computed" in markdown.out


def test_latest_main_resolves_to_the_newest_succeeded_run_of_the_series(real_runs):
    base_id, cand_id = real_runs.ids
    assert f"run          {base_id}" in real_runs.cli("status", "latest:main").out
    marked = real_runs.cli("baseline", cand_id, "--label", "main")
    assert marked.code == 0, marked.explain()
    assert f"run          {cand_id}" in real_runs.cli("status", "latest:main").out
    # Compared with latest:main, the newest run is never its own baseline.
    again = real_runs.cli("compare", "latest:main", cand_id, "--metric", "output_throughput")
    assert f"base       {base_id}" in again.out, again.explain()


def test_a_run_that_fails_exits_2_with_its_reason(real_runs, tiny_model):
    # A model directory the portal allows (next to the tiny model) that cannot load.
    model = tiny_model.parent / "broken-model-for-tests"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    broken = real_spec(str(model))
    broken["backends"] = [{"kind": "hf-sequential", "num_prompts": 2, "num_warmups": 0}]
    (real_runs.workdir / "broken.yaml").write_text(yaml.safe_dump(broken))
    result = real_runs.cli(
        "submit", "broken.yaml", "--wait", "--poll", "2s", "--timeout", "10m",
        "--summary", "broken.md",
    )  # fmt: skip
    assert result.code == 2, result.explain()
    error = [line for line in result.err.splitlines() if line.startswith("servebench: error:")]
    assert len(error) == 1 and " failed: " in error[0], result.explain()
    # The portal's reason points at the measurements; the line carries the first one's.
    assert "first error: hf-sequential baseline: " in error[0], result.explain()
    assert "servebench: error" in (real_runs.workdir / "broken.md").read_text()


# --------------------------------------------------------------------------- judging a change


def _documents(real_runs: RealRuns, *ids: str) -> list[str]:
    """Each run's result document written to a file, as a CI job downloads it."""
    names = []
    for run_id in ids:
        got = real_runs.cli("results", run_id, "--format", "json")
        assert got.code == 0, got.explain()
        (real_runs.workdir / f"{run_id}.json").write_text(got.out)
        names.append(f"{run_id}.json")
    return names


def test_a_flag_change_that_slows_the_server_fails_the_gate_naming_the_flag(real_runs):
    flag = real_runs.flag
    base_id, _ = real_runs.ids
    assert flag.code == 1, flag.explain()  # judged: worse, not "not comparable"
    assert f"base       {base_id}" in flag.out  # latest:main: main's run of this measurement
    (changed,) = [line for line in flag.out.splitlines() if line.startswith("what changed")]
    assert "vllm.max_num_seqs: default → 1" in changed, flag.explain()
    # One sequence at a time under a load of 4: requests queue behind it. Which metric
    # shows it beyond the noise depends on the machine (on a quiet one output tok/s drops
    # by half; with the CPUs busy the queueing shows in TTFT while throughput is CPU-bound
    # either way): a regression at that load, whichever metric it is.
    worse = [line for line in flag.out.splitlines() if line.strip().startswith("WORSE")]
    assert any("vllm concurrency:max_concurrency=4 " in line for line in worse), flag.explain()
    summary = (real_runs.workdir / "flag.md").read_text()
    assert summary.startswith("### 🔴") and "vllm.max_num_seqs: default → 1" in summary
    # The same verdict offline, from the runner's result documents alone.
    files = _documents(real_runs, base_id, real_runs.flag_id)
    offline = real_runs.cli("compare", *files)
    assert offline.code == 1, offline.explain()
    assert "vllm.max_num_seqs: default → 1" in offline.out


def test_an_identical_pair_passes_the_gate_online_and_offline(real_runs):
    base_id, cand_id = real_runs.ids
    online = real_runs.cli("compare", base_id, cand_id)
    assert online.code == 0, online.explain()
    assert "what changed  nothing in the configuration" in online.out
    offline = real_runs.cli("compare", *_documents(real_runs, base_id, cand_id))
    assert offline.code == 0, offline.explain()


def test_a_workload_change_is_not_comparable_and_names_the_field(real_runs, tiny_model):
    base_id, _ = real_runs.ids
    other = real_spec(str(tiny_model))
    other["workload"]["output_len"] = 8
    other["backends"] = [{"kind": "hf-sequential", "num_prompts": 4, "num_warmups": 0}]
    (real_runs.workdir / "workload.yaml").write_text(yaml.safe_dump(other))
    submitted = real_runs.cli(
        "submit", "workload.yaml", "--wait", "--poll", "2s", "--timeout", "10m",
        "--baseline", base_id,
    )  # fmt: skip
    assert submitted.code == 2, submitted.explain()
    assert "workload.output_len: 16 vs 8" in submitted.err, submitted.explain()
    other_id = submitted.out.splitlines()[0].rstrip("/").rsplit("/", 1)[-1]
    offline = real_runs.cli("compare", *_documents(real_runs, base_id, other_id))
    assert offline.code == 2 and "workload.output_len: 16 vs 8" in offline.err, offline.explain()
