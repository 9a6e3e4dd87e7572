"""The runner -> portal reporter against a real local HTTP server (tests/runners/conftest.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from runners.report import Reporter, ReportError, ReportRejected, RunCancelled
from runners.result import Event, Measurement, PointInfo, ResultDocument

TOKEN = "sb_run_test_token_123"


def measurement(repeat: int = 0) -> Measurement:
    return Measurement(
        backend="vllm",
        backend_kind="vllm",
        point=PointInfo(
            key="concurrency:max_concurrency=4",
            sweep="concurrency",
            axis="max_concurrency",
            value=4,
            input_len=128,
            output_len=32,
            max_concurrency=4,
            num_prompts=32,
        ),
        repeat=repeat,
        status="succeeded",
        metrics={"output_throughput": 536.0},
        started_at="2026-11-30T00:00:00+00:00",
        finished_at="2026-11-30T00:00:05+00:00",
        duration_s=5.0,
    )


def fast_reporter(url: str, **kw) -> Reporter:
    return Reporter(url, TOKEN, base_delay_s=0.05, max_delay_s=0.2, timeout_s=5, **kw)


def test_it_retries_until_the_portal_accepts(portal):
    portal.fail_next["measurements"] = [503, 502]
    fast_reporter(portal.url).measurement(measurement())
    attempts = [r for r in portal.received if r.path.endswith("/measurements")]
    assert [r.status for r in attempts] == [503, 502, 201]
    assert attempts[0].body == attempts[1].body == attempts[2].body
    assert {r.authorization for r in attempts} == {f"Bearer {TOKEN}"}
    assert list(portal.measurements) == [("vllm", "concurrency:max_concurrency=4", 0)]


def test_a_repeated_measurement_is_harmless(portal):
    reporter = fast_reporter(portal.url)
    reporter.measurement(measurement())
    reporter.measurement(measurement())
    assert [r.status for r in portal.received] == [201, 200]
    assert len(portal.measurements) == 1


def test_408_and_429_are_retried_too(portal):
    portal.fail_next["events"] = [408, 429]
    fast_reporter(portal.url).event(Event(type="progress", done=1, total=2))
    assert [r.status for r in portal.received] == [408, 429, 200]


def test_a_409_means_the_run_was_cancelled(portal):
    portal.fail_next["measurements"] = [409]
    with pytest.raises(RunCancelled):
        fast_reporter(portal.url).measurement(measurement())
    assert len(portal.received) == 1


def test_other_4xx_are_final(portal):
    portal.fail_next["events"] = [400]
    with pytest.raises(ReportRejected, match="the portal answered 400"):
        fast_reporter(portal.url).event(Event(type="started", total=3))
    assert len(portal.received) == 1


def test_an_unreachable_portal_gives_up_after_the_budget():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    reporter = fast_reporter(f"http://127.0.0.1:{port}/x", max_elapsed_s=1.0)
    with pytest.raises(ReportError, match="kept failing"):
        reporter.event(Event(type="started", total=1))


# --------------------------------------------------------------------------- a whole run


def run_cli(spec_path, portal, tmp_path, timeout=600) -> subprocess.CompletedProcess:
    """`python -m runners run` with the token in the environment, as Kubernetes runs it."""
    env = {**os.environ, "SERVEBENCH_RUN_TOKEN": TOKEN}
    argv = [sys.executable, "-m", "runners", "run", str(spec_path), "--report", portal.url]
    argv += ["--out", str(tmp_path / "result.json"), "--workdir", str(tmp_path / "work")]
    assert TOKEN not in " ".join(argv)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def hf_only_spec(tiny_model, tmp_path):
    spec = {
        "model": {"id": str(tiny_model), "max_model_len": 256},
        "workload": {"input_len": 32, "output_len": 8},
        "backends": [{"kind": "hf-sequential", "num_prompts": 2}],
        "repeats": 2,
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def test_a_run_reports_in_protocol_order_and_idempotently(hf_only_spec, portal, tmp_path):
    portal.fail_next["measurements"] = [503]  # the first post is retried, stored once
    done = run_cli(hf_only_spec, portal, tmp_path)
    assert done.returncode == 0, done.stderr
    events = portal.events()
    assert [e["type"] for e in events] == [
        "started",
        "environment",
        "progress",
        "progress",
        "finished",
    ]
    assert events[0]["total"] == 2
    assert len(events[1]["fingerprint"]) == 64 and events[1]["environment"]["gpu"]
    assert [(e["done"], e["total"]) for e in events[2:4]] == [(1, 2), (2, 2)]
    assert events[-1]["status"] == "succeeded"
    posts = [r for r in portal.received if r.path.endswith("/measurements")]
    assert [r.status for r in posts] == [503, 201, 201]
    assert sorted(portal.measurements) == [
        ("hf-sequential", "baseline", 0),
        ("hf-sequential", "baseline", 1),
    ]
    document = ResultDocument.model_validate_json((tmp_path / "result.json").read_text())
    assert document.status == "succeeded"
    assert [m.model_dump(mode="json") for m in document.measurements] == [
        portal.measurements[("hf-sequential", "baseline", r)] for r in (0, 1)
    ]
    assert "[2/2] hf-sequential baseline r1  output" in done.stderr


def test_a_cancelled_run_stops_without_further_reports(hf_only_spec, portal, tmp_path):
    portal.fail_next["measurements"] = [409]
    done = run_cli(hf_only_spec, portal, tmp_path)
    assert done.returncode == 1
    assert [e["type"] for e in portal.events()] == ["started", "environment"]
    assert len([r for r in portal.received if r.path.endswith("/measurements")]) == 1
    document = ResultDocument.model_validate_json((tmp_path / "result.json").read_text())
    assert document.status == "failed"
    assert len(document.measurements) == 1  # measured before the portal said no: kept
    assert "the portal cancelled the run" in document.errors[-1]["message"]
