"""Runner -> portal ingestion (docs/protocol.md) with run-scoped tokens."""

from __future__ import annotations

import pytest

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.benchmarks.models import Environment, Measurement, RunStatus
from runners.result import ResultDocument

pytestmark = pytest.mark.django_db


@pytest.fixture
def runner(make_run, personas, bearer_client):
    """A dispatched run of the owner's, and a client holding its run token."""

    def make(**fields):
        run = make_run(owner=personas["owner"].user, status=RunStatus.DISPATCHED, **fields)
        token = issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run).plaintext
        return run, bearer_client(token)

    return make


def url(run, what: str) -> str:
    return f"/api/v1/runner/runs/{run.public_id}/{what}"


def post(client, run, what, body):
    return client.post(url(run, what), body, content_type="application/json")


def test_a_run_token_writes_to_its_own_run_only(runner, measurement, personas):
    _run_a, client_a = runner()
    run_b, client_b = runner()
    response = post(client_a, run_b, "measurements", measurement())
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "wrong_run"
    assert post(client_a, run_b, "events", {"type": "started", "total": 3}).status_code == 403
    assert Measurement.objects.count() == 0
    run_b.refresh_from_db()
    assert run_b.status == RunStatus.DISPATCHED
    assert post(client_b, run_b, "measurements", measurement()).status_code == 201


def test_user_tokens_sessions_and_anonymous_cannot_write(runner, measurement, personas):
    run, _ = runner(is_public=True)
    for who in ("owner", "other", "anon"):
        response = post(personas[who].client, run, "measurements", measurement())
        assert response.status_code == 401, who
        assert response.json()["error"]["code"] in ("invalid_token", "not_authenticated")
    assert Measurement.objects.count() == 0


def test_an_unknown_run_is_404(runner, measurement):
    _run, client = runner()
    response = client.post(
        "/api/v1/runner/runs/nosuchrun000000000000/measurements",
        measurement(),
        content_type="application/json",
    )
    assert response.status_code == 404


def test_a_repeated_measurement_is_stored_once(runner, measurement):
    run, client = runner()
    first = post(client, run, "measurements", measurement())
    assert first.status_code == 201 and first.json() == {"ok": True, "created": True}
    changed = measurement(metrics={"output_throughput": 1.0})  # a retry never rewrites
    again = post(client, run, "measurements", changed)
    assert again.status_code == 200 and again.json() == {"ok": True, "created": False}
    assert Measurement.objects.filter(run=run).count() == 1
    assert Measurement.objects.get(run=run).output_throughput == 56.0
    other_point = measurement(point_key="concurrency:max_concurrency=4")
    assert post(client, run, "measurements", other_point).status_code == 201
    baseline = measurement(backend="hf-sequential", point_key="baseline")
    assert post(client, run, "measurements", baseline).status_code == 201
    assert Measurement.objects.filter(run=run).count() == 3


def test_the_event_sequence_drives_the_run(runner, measurement):
    run, client = runner()
    started = post(client, run, "events", {"type": "started", "total": 3})
    assert started.json() == {"ok": True, "run_status": "running"}
    env = {
        "type": "environment",
        "environment": {
            "gpu": {"model": "none", "count": 0, "driver_version": "none"},
            "software": {"torch": "2.13.0", "vllm": "0.32.0"},
        },
        "fingerprint": "a" * 64,
    }
    assert post(client, run, "events", env).status_code == 200
    assert post(client, run, "measurements", measurement()).status_code == 201
    progress = {"type": "progress", "done": 1, "total": 3, "message": "1/3"}
    assert post(client, run, "events", progress).status_code == 200
    run.refresh_from_db()
    assert (run.progress_done, run.progress_total, run.status) == (1, 3, RunStatus.RUNNING)
    environment = Environment.objects.get(run=run)
    assert environment.torch_version == "2.13.0"
    assert (environment.gpu_name, environment.gpu_count, environment.driver) == ("CPU", 0, "")
    assert (run.gpu_name, run.gpu_count) == ("CPU", 0)
    # The other two measurements of the spec (HF baseline, concurrency 4).
    for body in (
        measurement(backend="hf-sequential", point_key="baseline"),
        measurement(point_key="concurrency:max_concurrency=4"),
    ):
        assert post(client, run, "measurements", body).status_code == 201, body
    finished = {
        "type": "finished",
        "status": "succeeded",
        "errors": [],
        "timings": {"duration_s": 9},
    }
    response = post(client, run, "events", finished)
    assert response.json() == {"ok": True, "run_status": "succeeded"}
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.finished_at and run.started_at
    # The runner retries a final event whose answer it lost: accepted, nothing changes.
    assert post(client, run, "events", finished).status_code == 200


def test_reports_after_the_run_ended_get_409_so_the_runner_stops(runner, measurement):
    from portal.benchmarks import lifecycle

    run, client = runner()
    assert post(client, run, "measurements", measurement()).status_code == 201
    lifecycle.cancel_run(run)
    for body in ({"type": "progress", "done": 1, "total": 3}, {"type": "started", "total": 3}):
        response = post(client, run, "events", body)
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "run_finished"
        assert response.json()["run_status"] == "cancelled"
    other_point = measurement(point_key="concurrency:max_concurrency=4")
    assert post(client, run, "measurements", other_point).status_code == 409
    # ...but a retry of a measurement it already delivered is still a harmless 200.
    assert post(client, run, "measurements", measurement()).status_code == 200
    finished = {"type": "finished", "status": "succeeded"}
    assert post(client, run, "events", finished).status_code == 409
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_a_success_missing_measurements_fails_the_run(runner, measurement):
    # A runner that says "succeeded" while a measurement never reached the portal (a
    # refused report, a lost one): the run must not look complete anywhere.
    run, client = runner()
    post(client, run, "events", {"type": "started", "total": 3})
    assert post(client, run, "measurements", measurement()).status_code == 201
    response = post(client, run, "events", {"type": "finished", "status": "succeeded"})
    assert response.json()["run_status"] == "failed"
    run.refresh_from_db()
    assert run.outcome == "partial"
    assert "only 1 of 3 measurements reached the portal" in run.failure_reason


def test_a_partial_finish_fails_the_run_listing_the_failed_points(runner, measurement):
    from portal.benchmarks import documents

    run, client = runner()
    post(client, run, "events", {"type": "started", "total": 3})
    post(client, run, "measurements", measurement())
    post(
        client,
        run,
        "measurements",
        measurement(point_key="concurrency:max_concurrency=4", status="failed", error="OOM"),
    )
    errors = [{"where": "vllm concurrency:max_concurrency=4", "message": "OOM"}]
    response = post(
        client, run, "events", {"type": "finished", "status": "partial", "errors": errors}
    )
    assert response.json()["run_status"] == "failed"
    run.refresh_from_db()
    assert run.outcome == "partial"
    assert "1 of 3 measurements failed" in run.failure_reason
    assert "vllm concurrency:max_concurrency=4 (repeat 0): OOM" in run.failure_reason
    doc = ResultDocument.model_validate(documents.result_document(run))
    assert doc.status == "partial" and len(doc.measurements) == 2


def test_a_failed_event_carries_the_runners_reason(runner):
    run, client = runner()
    body = {"type": "failed", "message": "vLLM server did not start: CUDA OOM", "errors": []}
    assert post(client, run, "events", body).json()["run_status"] == "failed"
    run.refresh_from_db()
    assert run.failure_reason == "vLLM server did not start: CUDA OOM"


BAD_BODIES = [
    ("unknown event type", "events", {"type": "exploded"}, "type"),
    ("unknown event field", "events", {"type": "progress", "colour": 1}, "colour"),
    ("measurement without point", "measurements", {"backend": "vllm"}, "backend_kind"),
    ("negative repeat", "measurements", "NEG_REPEAT", "repeat"),
    ("metric of the wrong type", "measurements", "BAD_METRIC", "metrics.output_throughput"),
]


@pytest.mark.parametrize(
    ("what", "body", "field"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES]
)
def test_invalid_reports_get_400_naming_the_field(runner, measurement, what, body, field):
    run, client = runner()
    if body == "NEG_REPEAT":
        body = measurement(repeat=-1)
    elif body == "BAD_METRIC":
        body = measurement(metrics={"output_throughput": "fast"})
    response = post(client, run, what, body)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    assert Measurement.objects.count() == 0


def test_malformed_json_is_400(runner):
    run, client = runner()
    response = client.post(url(run, "events"), b"{nope", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_body"
