"""Runs: creation through the service, status transitions as conditional updates."""

from __future__ import annotations

import pytest

from portal.benchmarks import documents, intake, lifecycle
from portal.benchmarks.models import Run, RunStatus
from runners import spec as rs

pytestmark = pytest.mark.django_db


def test_create_run_stores_validated_spec_and_filter_columns(make_user, spec_dict):
    owner = make_user()
    run = intake.create_run(owner, spec_dict(), name="my run")
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    assert run.name == "my run"
    assert run.model_id == "org/tiny-model"
    assert run.backends == ["hf-sequential", "vllm"]
    assert run.progress_total == 3  # 1 HF + 2 vLLM points
    assert run.spec["workload"]["seed"] == 0  # defaults filled in
    assert run.spec_version == rs.SPEC_VERSION
    assert len(run.public_id) == 20 and run.public_id.isalnum()
    assert len(run.fingerprint) == 64


def test_create_run_enqueues_dispatch_only_after_commit(
    make_user, spec_dict, django_capture_on_commit_callbacks
):
    owner = make_user()
    with django_capture_on_commit_callbacks() as callbacks:
        intake.create_run(owner, spec_dict())
    assert len(callbacks) == 1


def test_it_rejects_an_invalid_spec_and_stores_nothing(
    make_user, spec_dict, django_capture_on_commit_callbacks
):
    owner = make_user()
    bad = spec_dict(workload={"input_len": -5})
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(rs.SpecError) as exc:
        intake.create_run(owner, bad)
    assert exc.value.errors[0]["field"] == "workload.input_len"
    assert Run.objects.count() == 0
    assert callbacks == []


def test_public_ids_are_unique_and_unguessable(make_run):
    ids = {make_run().public_id for _ in range(5)}
    assert len(ids) == 5


def test_same_workload_and_gpu_share_a_fingerprint(make_run, make_user, spec_dict):
    a = make_run(spec=spec_dict(name="first"))
    b = make_run(spec=spec_dict(name="second", repeats=2))
    c = make_run(spec=spec_dict(workload={"input_len": 32, "output_len": 16}))
    assert a.fingerprint == b.fingerprint  # names and repeats do not change what is measured
    assert a.fingerprint != c.fingerprint


def test_transition_is_a_conditional_update(make_run):
    run = make_run()
    assert lifecycle.transition(run.pk, RunStatus.DISPATCHED, expected=(RunStatus.QUEUED,))
    # A second claim (a redelivered task, another worker) finds nothing to update.
    assert not lifecycle.transition(run.pk, RunStatus.DISPATCHED, expected=(RunStatus.QUEUED,))
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED


def test_final_states_never_move(make_run):
    run = make_run(status=RunStatus.SUCCEEDED)
    assert not lifecycle.transition(run.pk, RunStatus.FAILED)
    assert not lifecycle.transition(run.pk, RunStatus.CANCELLED)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED


def test_a_transition_outside_the_documented_table_is_a_bug(make_run):
    run = make_run()
    with pytest.raises(ValueError, match="not allowed"):
        lifecycle.transition(run.pk, RunStatus.SUCCEEDED, expected=(RunStatus.QUEUED,))


def test_cancel_moves_an_active_run_once(make_run, django_capture_on_commit_callbacks):
    run = make_run()
    with django_capture_on_commit_callbacks() as callbacks:
        assert lifecycle.cancel_run(run, by=run.owner)
    assert len(callbacks) == 1  # the stop task
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert run.failure_reason == f"cancelled by {run.owner.username}"
    assert run.finished_at is not None
    assert not lifecycle.cancel_run(run)


def test_result_document_of_a_fresh_run_validates_against_the_contract(make_run):
    from runners.result import ResultDocument

    run = make_run()
    doc = documents.result_document(run)
    ResultDocument.model_validate(doc)
    assert doc["status"] == "running"
    assert doc["spec"] == run.spec


def test_migrations_match_the_models():
    from django.core.management import call_command

    call_command("makemigrations", "--check", "--dry-run", verbosity=0)
