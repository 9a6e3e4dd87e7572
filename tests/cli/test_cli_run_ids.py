"""`servebench status <short id>`: a unique prefix of a run's id names it in the CLI, as on
pages and in the API; an ambiguous or unknown one is one line on stderr and exit 2, and
never reveals another user's private run."""

from __future__ import annotations

import pytest

from portal.benchmarks.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def with_id(run: Run, public_id: str) -> Run:
    Run.objects.filter(pk=run.pk).update(public_id=public_id)
    run.refresh_from_db()
    return run


def test_status_results_and_cancel_take_a_short_id(cli, live_server, personas, measured_run):
    url, owner = live_server.url, personas["owner"]
    run = with_id(measured_run(owner.user), "feed0001" + "c" * 12)
    status = cli("status", run.short_id, url=url, token=owner.token)
    assert status.code == 0, status.err
    assert run.public_id in status.out
    results = cli("results", "feed00", "--format", "json", url=url, token=owner.token)
    assert results.code == 0, results.err
    assert len(results.out) > 0
    # A page URL with a short id works too.
    assert cli("status", f"{url}/runs/feed0001/", url=url, token=owner.token).code == 0


def test_an_ambiguous_or_hidden_prefix_is_one_line_and_exit_2(
    cli, live_server, personas, measured_run
):
    url, owner, other = live_server.url, personas["owner"], personas["other"]
    with_id(measured_run(owner.user), "beef0001" + "d" * 12)
    with_id(measured_run(owner.user), "beef0002" + "d" * 12)
    theirs = with_id(measured_run(other.user), "cafe0001" + "d" * 12)

    ambiguous = cli("status", "beef000", url=url, token=owner.token)
    assert ambiguous.code == 2 and len(ambiguous.err_lines) == 1, ambiguous.err
    assert "starts 2 runs you can see; give more of the id" in ambiguous.err

    hidden = cli("status", "cafe0001", url=url, token=owner.token)
    unknown = cli("status", "0000dead", url=url, token=owner.token)
    assert hidden.code == unknown.code == 2
    assert "no run 'cafe0001' that you can see" in hidden.err
    assert theirs.public_id not in hidden.err
    assert cli("status", "cafe0001", url=url, token=other.token).code == 0


def test_submit_prints_what_the_executor_may_not_give(
    cli, live_server, personas, settings, tmp_path, monkeypatch
):
    """A spec the portal queues with a preflight warning (a hub model this offline machine
    does not have) says so on stderr at submit, not ~30 s later as a failed run."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings.SERVEBENCH_EXECUTOR = "local"
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: offline\nmodel: {id: org/not-here}\nbackends: [{kind: hf-sequential}]\n"
        "workload: {num_prompts: 2, input_len: 8, output_len: 4}\nresources: {gpu_count: 0}\n"
    )
    owner = personas["owner"]
    result = cli("submit", str(spec), url=live_server.url, token=owner.token)
    assert result.code == 0, result.err
    warning = [line for line in result.err_lines if "warning" in line]
    assert warning and "spec.model.id" in warning[0], result.err
    assert "not in this machine's Hugging Face cache" in warning[0]
    assert Run.objects.filter(owner=owner.user, name="offline").exists()
