"""A failed run says why in one line, at the top of its page and in the API: the first real
cause and the next step (runners.causes), written by the real runner when every
measurement failed, and by the portal when only some did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.benchmarks import ingestion, intake
from portal.benchmarks.models import Run, RunStatus
from runners import result as rr
from runners.report import Reporter
from runners.runner import ExitCode, Runner
from runners.spec import Spec

# Its slow tests assert nothing a busy CPU changes: make test runs them beside others.
pytestmark = pytest.mark.shares_cpu

UNCACHED = "servebench-tests/not-in-any-cache"


def offline_spec(backends: list[dict[str, Any]]) -> Spec:
    return Spec.model_validate(
        {
            "name": "a hub model this machine cannot fetch",
            "model": {"id": UNCACHED, "max_model_len": 512},
            "workload": {"input_len": 32, "output_len": 8, "num_prompts": 2, "num_warmups": 0},
            "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1]}],
            "backends": backends,
            "resources": {"gpu_count": 0, "timeout_minutes": 10},
        }
    )


def run_for_real(
    spec: Spec, owner: Any, live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Run:
    """The real runner, in this process, reporting to the live portal with a run token."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache of our own
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = intake.create_run(owner, spec.model_dump(mode="json"), is_public=True)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.DISPATCHED)
    token = issue_token(owner, kind=ApiToken.Kind.RUN, run=run).plaintext
    url = f"{live_server.url}/api/v1/runner/runs/{run.public_id}"
    runner = Runner(spec, workdir=tmp_path / "work", out=tmp_path / "result.json",
                    reporter=Reporter(url, token))  # fmt: skip
    assert runner.run() == ExitCode.FAILED
    run.refresh_from_db()
    return run


def first_line(run: Run) -> str:
    return run.failure_reason.splitlines()[0]


@pytest.mark.django_db(transaction=True)
def test_an_uncached_hub_model_offline_fails_saying_so_in_one_line(
    live_server: Any, make_user: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner = make_user("alice")
    spec = offline_spec([{"kind": "hf-sequential", "num_prompts": 2, "num_warmups": 0}])
    run = run_for_real(spec, owner, live_server, tmp_path, monkeypatch)
    assert run.status == RunStatus.FAILED
    line = first_line(run)
    assert line.startswith("hf-sequential baseline: the HF baseline failed: ")
    assert "Next: the machine that ran it could not get the model" in line
    assert f"huggingface-cli download {UNCACHED}" in line
    assert "see the errors" not in run.failure_reason
    # The owner's API and page, and a reader of the public run, all lead with that line.
    client = Client()
    client.force_login(owner)
    body = client.get(f"/api/v1/runs/{run.public_id}/").json()
    assert body["failure_reason"].splitlines()[0] == line
    public = Client().get(f"/api/v1/runs/{run.public_id}/").json()["failure_reason"]
    assert public.startswith(line[:200])  # readers get that line (cut, scrubbed: sharing)
    status = client.get(f"/runs/{run.public_id}/status.json").json()
    assert status["failure_reason"].splitlines()[0] == line


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_vllm_server_that_cannot_load_the_model_names_the_root_cause(
    live_server: Any, make_user: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    have_vllm: None,
) -> None:  # fmt: skip
    owner = make_user("alice")
    run = run_for_real(offline_spec([{"kind": "vllm"}]), owner, live_server, tmp_path, monkeypatch)
    line = first_line(run)
    assert line.startswith(
        "vllm concurrency:max_concurrency=1: the vLLM server exited with code 1 before it was "
        "ready: "
    )
    assert "LocalEntryNotFoundError" in line and "Next: " in line


@pytest.mark.django_db
def test_a_partly_failed_run_leads_with_its_first_failed_points_cause(
    make_run: Any, measurement: Any
) -> None:
    run = make_run(status=RunStatus.RUNNING)
    ingestion.ingest_measurement(run, rr.Measurement.model_validate(measurement()))
    traceback = (
        "vLLM's bench client exited with code 1 without a result. Last lines of its log "
        '(/work/c4.client.log):\nTraceback (most recent call last):\n  File "x.py", line 1\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "During handling of the above exception, another exception occurred:\n"
        "RuntimeError: the client gave up"
    )
    failed = measurement(
        point_key="concurrency:max_concurrency=4", status="failed", error=traceback
    )
    ingestion.ingest_measurement(run, rr.Measurement.model_validate(failed))
    ingestion.ingest_event(run, rr.Event(type="finished", status="partial", errors=[]))
    run.refresh_from_db()
    lines = run.failure_reason.splitlines()
    assert lines[0] == (
        "vllm concurrency:max_concurrency=4 (repeat 0): vLLM's bench client exited with code 1 "
        "without a result: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "2.00 GiB. Next: it ran out of memory: lower max_model_len, gpu_memory_utilization or "
        "the concurrency, or use a larger GPU"
    )
    assert lines[1] == "1 of 3 measurements failed; the 1 that succeeded are kept."
    assert "RuntimeError" not in run.failure_reason  # raised while handling: not the cause
