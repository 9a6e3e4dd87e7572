"""One run per hardware slot: the local executor never runs two runners at once.

Twenty runs submitted at once through the API, a real Celery worker (restarted halfway)
with beat, the real local executor and supervisor. A stand-in takes the runner's place
(`python -m runners run SPEC --report URL`): it reports ``started`` and then ``failed``
with its own message through the real ``runners.report.Reporter``, and records when it
started and ended, so the test can check that no two ever overlapped.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
from localruns import supervisor_pid

from portal.benchmarks.models import Run, RunStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

RUNS = "/api/v1/runs/"
DONE = "stand-in runner: done"

STAND_IN = """#!{python}
import json, os, sys, time
from pathlib import Path
from runners.report import Reporter
from runners.result import Event

spec = json.loads(Path(sys.argv[4]).read_text())
marks = Path({marks!r})
name = Path(sys.argv[4]).parent.name
(marks / f"{{name}}.start").write_text(repr(time.time()))
reporter = Reporter(sys.argv[sys.argv.index("--report") + 1], os.environ["SERVEBENCH_RUN_TOKEN"])
reporter.event(Event(type="started", total=1))
time.sleep(0.3)
(marks / f"{{name}}.end").write_text(repr(time.time()))
reporter.event(Event(type="failed", message={done!r}))
"""


@pytest.fixture
def stand_in(tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    path = tmp_path / "stand-in"
    path.write_text(STAND_IN.format(python=sys.executable, marks=str(marks), done=DONE))
    path.chmod(0o755)
    return path, marks


def submit(client, n: int) -> str:
    spec = {
        "name": f"slot test {n}",
        "model": {"id": "org/tiny-model", "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 4},
        "backends": [{"kind": "vllm"}],
        "resources": {"gpu_count": 0, "timeout_minutes": 10},
    }
    response = client.post(RUNS, json.dumps({"spec": spec}), content_type="application/json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_twenty_runs_take_turns_none_lost_or_duplicated(
    personas, live_server, celery_worker, waiter, stand_in, tmp_path
):
    script, marks = stand_in
    env = {
        "SERVEBENCH_RUNNER_PYTHON": str(script),
        "SERVEBENCH_DATA_DIR": str(tmp_path / "data"),
        "SERVEBENCH_LOCAL_SLOTS": "1",
    }
    worker = celery_worker(
        public_url=live_server.url, beat=True, reconcile_seconds=2, extra_env=env
    )
    owner = personas["owner"].client
    ids = [submit(owner, n) for n in range(20)]

    # The last one waits visibly, with its place in the queue, and can be cancelled.
    body = owner.get(f"{RUNS}{ids[-1]}/").json()
    assert body["status"] == "queued"
    assert body["queue"]["ahead"] >= 1 and body["queue"]["slots"] == 1
    cancelled = ids.pop()  # the one just seen queued: it never starts
    assert owner.post(f"{RUNS}{cancelled}/cancel").status_code == 202

    # A worker restart halfway loses nothing: the queue lives in PostgreSQL.
    waiter(lambda: len(list(marks.glob("*.end"))) >= 6, 120, "six runs to finish")
    worker.proc.terminate()
    worker.proc.wait(timeout=60)
    celery_worker(public_url=live_server.url, beat=True, reconcile_seconds=2, extra_env=env)

    def all_final():
        runs = list(Run.objects.filter(public_id__in=ids))
        return runs if all(r.is_final for r in runs) else None

    runs = waiter(all_final, 300, "all nineteen runs to end")
    for run in runs:
        assert run.status == RunStatus.FAILED and run.failure_reason == DONE, (
            run.public_id,
            run.failure_reason,
        )
        assert supervisor_pid(run.executor_handle) is not None
        assert run.executor_handle["attempts"] == 1
    # Each runner started once, and none while another was alive.
    starts = sorted(marks.glob("*.start"))
    assert sorted(p.stem for p in starts) == sorted(ids)
    spans = sorted(
        (float(p.read_text()), float((marks / f"{p.stem}.end").read_text())) for p in starts
    )
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start > end, "two runners were alive at once"
    # First come, first served.
    order = [p.stem for p in sorted(starts, key=lambda p: float(p.read_text()))]
    assert order == ids
    # The cancelled one never started, and no slot stays taken.
    assert Run.objects.get(public_id=cancelled).status == RunStatus.CANCELLED
    assert not (Path(tmp_path / "data" / "runs" / cancelled) / "supervisor.json").exists()
    waiter(lambda: not Run.objects.filter(holds_slot=True).exists(), 30, "every slot to be freed")
