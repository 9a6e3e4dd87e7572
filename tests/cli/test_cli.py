"""The servebench CLI against a live test server (real portal, real PostgreSQL), on runs
whose measurements were stored through the real ingestion service. Exit codes: 0 ok / no
regression, 1 regression, 2 usage or server error with one line on stderr."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from portal.benchmarks.models import Baseline, Run, RunStatus
from servebench.compare import compare_documents

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def portal(live_server, personas):
    """(url, owner token, other user's token) of the live server."""
    return live_server.url, personas["owner"].token, personas["other"].token


def one_error_line(result) -> str:
    assert result.code == 2, (result.out, result.err)
    assert len(result.err_lines) == 1, result.err
    line = result.err_lines[0]
    assert line.startswith("servebench: error: ")
    return line


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- errors


def test_a_bad_token_is_one_line_and_exit_2(cli, portal, measured_run, personas):
    url, _, _ = portal
    run = measured_run(personas["owner"].user)
    result = cli("status", run.public_id, url=url, token="sb_ci_notatoken")
    line = one_error_line(result)
    assert "token was refused" in line and "SERVEBENCH_TOKEN" in line
    assert result.out == ""


def test_a_rate_limit_is_waited_out_within_its_budget_then_said(
    cli, portal, settings, monkeypatch, one_window
):
    """The portal's 429 (Retry-After: the window's end) is waited out and the call sent
    again, saying so; past SERVEBENCH_RETRY_WAIT_S it is one line naming the limit and when
    to try again."""
    from portal.lib.rates import Rate

    url, token, _ = portal
    settings.SERVEBENCH_RATES = {**settings.SERVEBENCH_RATES, "ci": Rate(1, 10)}
    one_window(10, 5)  # the first two calls in one window
    assert cli("presets", url=url, token=token).code == 0
    waited = cli("presets", url=url, token=token)  # the same window: 429, then a retry
    assert waited.code == 0, waited.err
    assert "the portal asks to wait" in waited.err and "again" in waited.err
    monkeypatch.setenv("SERVEBENCH_RETRY_WAIT_S", "0")
    line = one_error_line(cli("presets", url=url, token=token))
    assert "HTTP 429" in line and "try again in" in line and "per" in line
    monkeypatch.setenv("SERVEBENCH_RETRY_WAIT_S", "soon")
    assert "SERVEBENCH_RETRY_WAIT_S" in one_error_line(cli("presets", url=url, token=token))


def test_no_token_where_one_is_needed(cli, portal, tmp_path, spec_dict):
    url, _, _ = portal
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_dict()))
    line = one_error_line(cli("submit", str(spec), url=url))
    assert "this needs an API token" in line and "SERVEBENCH_TOKEN" in line
    assert not Run.objects.exists()


def test_an_unreachable_url_is_one_line_and_exit_2(cli):
    url = f"http://127.0.0.1:{closed_port()}"
    line = one_error_line(cli("status", "abc", url=url, token="sb_ci_x"))
    assert f"cannot reach the servebench portal at {url}" in line
    assert "SERVEBENCH_URL" in line
    assert "no portal URL" in one_error_line(cli("presets"))


def test_a_url_that_is_not_the_portal_is_one_line(cli, portal):
    url, token, _ = portal
    line = one_error_line(cli("presets", url=url + "/runs", token=token))
    assert "SERVEBENCH_URL" in line


def test_an_invalid_spec_names_its_field_online_and_offline(cli, portal, tmp_path, spec_dict):
    url, token, _ = portal
    bad = spec_dict(workload={"input_len": 0, "output_len": 16, "num_prompts": 8})
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump(bad))
    summary = tmp_path / "comment.md"
    result = cli("submit", str(spec), "--wait", "--summary", str(summary), url=url, token=token)
    line = one_error_line(result)
    assert "invalid spec: spec.workload.input_len: Input should be greater than" in line
    assert "spec.workload.input_len" in summary.read_text()
    assert not Run.objects.exists()
    offline = cli("validate", str(spec))
    assert offline.code == 2
    assert "spec.workload.input_len: Input should be greater than" in offline.err_lines[0]
    # The same words as the API's message.
    assert line.split("invalid spec: ")[1] == offline.err_lines[0].split(f"{spec}: ")[1]
    not_yaml = tmp_path / "broken.yaml"
    not_yaml.write_text("model: [unclosed\n")
    assert "not valid YAML or JSON at line" in one_error_line(
        cli("submit", str(not_yaml), url=url, token=token)
    )
    assert "not valid YAML or JSON" in cli("validate", str(not_yaml)).err
    assert cli("validate", str(tmp_path / "missing.yaml")).code == 2


def test_validate_accepts_a_good_spec(cli, tmp_path, spec_dict):
    spec = tmp_path / "good.yaml"
    spec.write_text(yaml.safe_dump(spec_dict()))
    result = cli("validate", str(spec))
    assert result.code == 0
    assert "valid: 3 measurements" in result.out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["compare", "a"], "required: CANDIDATE (see servebench compare --help)"),
        (["compare", "a", "b", "--threshold", "5"], "write a percentage (5%)"),
        (["compare", "a", "b", "--metric", "tokens_per_joule"], "unknown metric"),
        (["submit", "spec.yaml", "--baseline", "latest:main"], "need --wait"),
        (["submit"], "give a spec file or --preset NAME"),
        (["nonsense"], "'nonsense' is not one of the choices: submit, status"),
        (["results", "a", "--format", "jsno"], "--format: 'jsno': did you mean 'json'?"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(cli, argv, expected):
    assert expected in one_error_line(cli(*argv, url="http://127.0.0.1:9"))


# --------------------------------------------------------------------------- runs


def test_submit_prints_the_permalink_and_status_shows_progress(cli, portal, tmp_path, spec_dict):
    url, token, _ = portal
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_dict()))
    result = cli("submit", str(spec), "--name", "from the cli", url=url, token=token)
    assert result.code == 0, result.err
    run = Run.objects.get()
    assert result.out.strip() == f"{url}/runs/{run.public_id}/"
    assert run.name == "from the cli" and run.status == RunStatus.QUEUED
    assert f"servebench status {run.public_id}" in result.err
    status = cli("status", run.public_id, url=url, token=token)
    assert status.code == 0
    assert "queued, 0/3 points" in status.out
    # A page URL works wherever a RUN is taken.
    assert cli("status", result.out.strip(), url=url, token=token).code == 0
    cancel = cli("cancel", run.public_id, url=url, token=token)
    assert cancel.code == 0 and "cancelled run" in cancel.out
    again = cli("cancel", run.public_id, url=url, token=token)
    assert "already ended (cancelled)" in one_error_line(again)
    other = cli("status", run.public_id, url=url, token=portal[2])
    assert "no run" in one_error_line(other)


def test_results_in_every_format(cli, portal, personas, measured_run):
    url, token, _ = portal
    run = measured_run(personas["owner"].user)
    table = cli("results", run.public_id, url=url, token=token)
    assert table.code == 0
    assert "concurrency:max_concurrency=4" in table.out and "out tok/s" in table.out
    doc = json.loads(cli("results", run.public_id, "--format", "json", url=url, token=token).out)
    assert doc["schema_version"] == 1 and len(doc["measurements"]) == 3
    rows = list(
        csv.DictReader(
            io.StringIO(cli("results", run.public_id, "--format", "csv", url=url, token=token).out)
        )
    )
    assert len(rows) == 3
    by_point = {(r["backend"], r["point"]): r for r in rows}
    m = run.measurements.get(point_key="concurrency:max_concurrency=4")
    assert float(by_point[("vllm", m.point_key)]["output_throughput"]) == m.output_throughput
    md = cli("results", run.public_id, "--format", "markdown", url=url, token=token)
    assert md.out.startswith("### servebench:") and "| vllm |" in md.out


def test_presets(cli, portal):
    url, _, _ = portal
    result = cli("presets", url=url)
    assert result.code == 0 and "seed" in result.out
    presets = json.loads(cli("presets", "--format", "json", url=url).out)
    assert any(p["name"] == "seed" for p in presets)


# --------------------------------------------------------------------------- compare


def test_compare_of_the_same_distribution_exits_0(cli, portal, personas, measured_run):
    url, token, _ = portal
    base = measured_run(personas["owner"].user, seed=1)
    cand = measured_run(personas["owner"].user, seed=2)
    result = cli("compare", base.public_id, cand.public_id, url=url, token=token)
    assert result.code == 0, result.out + result.err
    assert "verdict: no regression" in result.out
    assert "WORSE" not in result.out
    for label in ("hf-sequential baseline", "vllm concurrency:max_concurrency=4"):
        assert label in result.out


def test_compare_finds_a_20_percent_regression_and_exits_1(
    cli, portal, personas, measured_run, tmp_path
):
    url, token, other_token = portal
    # One repeat each and no history: requests cannot see run-to-run noise, so a 20%
    # change is reported, not failed.
    alone = [measured_run(personas["other"].user, seed=s, shift=x) for s, x in ((1, 0), (2, 0.2))]
    unmeasured = cli("compare", *(r.public_id for r in alone), url=url, token=other_token)
    assert unmeasured.code == 0, unmeasured.out + unmeasured.err
    assert "noise not measured" in unmeasured.out and "WORSE" not in unmeasured.out
    assert "run-to-run noise was not measured" in unmeasured.out
    # Earlier runs of the series (main's history) measure the noise: now it fails.
    base = measured_run(personas["owner"].user, seed=1)
    for seed in (5, 6, 7):
        measured_run(personas["owner"].user, seed=seed)
    cand = measured_run(personas["owner"].user, seed=2, shift=0.2)
    summary = tmp_path / "comment.md"
    result = cli(
        "compare", base.public_id, cand.public_id, "--metric", "output_throughput,p99_ttft_ms",
        "--metric", "median_tpot_ms", "--summary", str(summary), url=url, token=token,
    )  # fmt: skip
    assert result.code == 1, result.out + result.err
    assert "WORSE vllm concurrency:max_concurrency=4 median_tpot_ms" in result.out
    assert "methods:" in result.out and "bootstrap" in result.out
    md = summary.read_text()
    assert md.startswith("### 🔴 servebench:")
    assert f"{url}/compare/?runs={base.public_id},{cand.public_id}&reference={base.public_id}" in md
    data = json.loads(
        cli("compare", base.public_id, cand.public_id, "--format", "json", url=url, token=token).out
    )
    assert data["regressed"] is True
    assert data["points"][0]["metrics"][0]["interval"] is not None
    markdown = cli("compare", base.public_id, cand.public_id, "--markdown", url=url, token=token)
    assert markdown.code == 1 and "| point | metric |" in markdown.out
    # A looser threshold for the one metric leaves it to the interval and the threshold.
    loose = cli(
        "compare", base.public_id, cand.public_id, "--metric", "median_tpot_ms",
        "--threshold", "median_tpot_ms=50%", url=url, token=token,
    )  # fmt: skip
    assert loose.code == 0 and "within threshold" in loose.out


def test_the_exit_code_agrees_with_the_computed_verdict(cli, portal, personas, measured_run):
    url, token, _ = portal
    base = measured_run(personas["owner"].user, seed=3)
    cand = measured_run(personas["owner"].user, seed=4, shift=0.04)
    result = cli(
        "compare", base.public_id, cand.public_id, "--format", "json", url=url, token=token
    )
    from portal.benchmarks.documents import result_document

    expected = compare_documents(result_document(base), result_document(cand))
    assert json.loads(result.out)["regressed"] == expected.regressed
    assert result.code == (1 if expected.regressed else 0)


def test_compare_refuses_a_failed_run_with_its_reason(
    cli, portal, personas, measured_run, tmp_path
):
    url, token, _ = portal
    base = measured_run(personas["owner"].user)
    failed = measured_run(personas["owner"].user, failed=True)
    summary = tmp_path / "comment.md"
    result = cli(
        "compare", base.public_id, failed.public_id, "--summary", str(summary),
        url=url, token=token,
    )  # fmt: skip
    line = one_error_line(result)
    assert f"candidate run {failed.public_id} failed: server failed to start" in line
    # The comment a pipeline posts says why there is no verdict.
    assert summary.read_text().startswith("### 🔴 servebench: error")
    assert "server failed to start" in summary.read_text()
    same = one_error_line(cli("compare", base.public_id, base.public_id, url=url, token=token))
    assert "same run" in same


def test_baseline_then_compare_with_latest(cli, portal, personas, measured_run):
    url, token, other_token = portal
    old = measured_run(personas["owner"].user, seed=1)
    marked = cli("label", old.public_id, "main", url=url, token=token)
    assert marked.code == 0 and "--compare-to latest:main" in marked.out
    assert Baseline.objects.get().run == old
    refused = cli("baseline", old.public_id, "--label", "main", url=url, token=other_token)
    assert "no run" in one_error_line(refused)  # private: not even visible
    for seed in (5, 6, 7):  # more runs of the series: the history that measures the noise
        measured_run(personas["owner"].user, seed=seed)
    new = measured_run(personas["owner"].user, seed=2, shift=0.2)
    result = cli("compare", "latest:main", new.public_id, url=url, token=token)
    assert result.code == 1, result.out
    assert "history" in result.out
    assert f"base       {old.public_id}" in result.out
    listing = cli("labels", "--label", "main", url=url, token=token)
    assert old.public_id in listing.out
    # A candidate marked under the same label does not become its own baseline.
    cli("label", new.public_id, "main", url=url, token=token)
    assert cli("compare", "latest:main", new.public_id, url=url, token=token).code == 1
    unset = cli("label", old.public_id, "main", "--unset", url=url, token=token)
    assert unset.code == 0
    missing = cli("compare", "latest:main", new.public_id, url=url, token=token)
    assert "servebench label RUN main" in one_error_line(missing)


# --------------------------------------------------------------------------- packaging


def test_the_cli_never_imports_django():
    code = (
        "import sys, servebench.cli, servebench.client, servebench.verdict, "
        "servebench.render, servebench.compare; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'portal')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_python_m_servebench_and_bin_servebench_run(tmp_path):
    # Not installed (the dev venv is not an editable install): PYTHONPATH for -m, and the
    # wrapper sets it itself.
    env = {**os.environ, "SERVEBENCH_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    for argv in ([sys.executable, "-m", "servebench"], [str(REPO / "bin" / "servebench")]):
        done = subprocess.run(
            [*argv, "--version"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("servebench ")
        usage = subprocess.run(
            [*argv, "compare"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert usage.returncode == 2
        assert usage.stderr.count("\n") == 1


def test_wait_says_the_queue_position_every_30_seconds(portal, tmp_path, spec_dict):
    # A queued run (no worker here): the wait prints where it stands in the queue every
    # 30 s, not only every few minutes. A clock that moves 5 s a look.
    import itertools

    from servebench import cli as sb_cli
    from servebench.client import Client, ServebenchError

    url, token, _ = portal
    client = Client(url, token)
    run = client.submit(yaml.safe_dump(spec_dict()))
    ticks = itertools.count(0, 5)
    out = io.StringIO()
    with pytest.raises(ServebenchError, match="timed out"):
        sb_cli.wait_for(
            client, run["id"], timeout=120, poll=0, out=out, clock=lambda: float(next(ticks))
        )
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3, lines
    assert all("queued" in line and "position 1 in the queue" in line for line in lines)
