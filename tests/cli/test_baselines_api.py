"""Baselines in the REST API: marking (personas), listing, and resolving latest:<label>."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.benchmarks.models import Baseline, Run, RunStatus

pytestmark = pytest.mark.django_db

RESOLVE = "/api/v1/runs/resolve"


def mark(persona, run: Run, label: str = "main"):
    return persona.client.post(
        f"/api/v1/runs/{run.public_id}/baseline", {"label": label}, content_type="application/json"
    )


def error(response) -> dict:
    body = response.json()["error"]
    assert body["code"] and body["message"]
    return body


def aged(run: Run, minutes: int) -> Run:
    """Make ``run`` look created ``minutes`` ago (runs resolve newest first)."""
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(minutes=minutes))
    run.refresh_from_db()
    return run


# --------------------------------------------------------------------------- marking


def test_the_owner_marks_a_run_and_marking_again_changes_nothing(personas, make_run):
    run = make_run(personas["owner"].user, status=RunStatus.SUCCEEDED)
    first = mark(personas["owner"], run)
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["label"] == "main" and body["set_by"] == "owner"
    assert body["run"]["id"] == run.public_id
    assert body["run"]["fingerprint"] == run.fingerprint
    again = mark(personas["owner"], run)
    assert again.status_code == 200
    assert Baseline.objects.filter(run=run).count() == 1


def test_another_user_may_not_mark_and_anonymous_gets_401(personas, make_run):
    private = make_run(personas["owner"].user, status=RunStatus.SUCCEEDED)
    public = make_run(personas["owner"].user, status=RunStatus.SUCCEEDED, is_public=True)
    assert mark(personas["other"], private).status_code == 404  # ids do not leak
    refused = mark(personas["other"], public)
    assert refused.status_code == 403
    assert "only the run's owner" in error(refused)["message"]
    anonymous = mark(personas["anon"], public)
    assert anonymous.status_code == 401
    assert error(anonymous)["code"] == "not_authenticated"
    unmark = personas["other"].client.delete(f"/api/v1/runs/{public.public_id}/baseline?label=main")
    assert unmark.status_code == 403
    assert not Baseline.objects.exists()


def test_staff_may_mark_anyones_run(personas, make_run, make_user):
    run = make_run(personas["owner"].user, status=RunStatus.SUCCEEDED)
    staff = Client()
    staff.force_login(make_user("staff", is_staff=True))
    response = staff.post(
        f"/api/v1/runs/{run.public_id}/baseline", {"label": "main"}, content_type="application/json"
    )
    assert response.status_code == 201
    assert response.json()["set_by"] == "staff"


@pytest.mark.parametrize("status", [RunStatus.FAILED, RunStatus.CANCELLED])
def test_a_failed_or_cancelled_run_is_not_a_baseline(personas, make_run, status):
    run = make_run(personas["owner"].user, status=status, failure_reason="deadline exceeded")
    response = mark(personas["owner"], run)
    assert response.status_code == 409
    assert "deadline exceeded" in error(response)["message"]
    assert error(response)["code"] == "run_not_succeeded"


@pytest.mark.parametrize("label", ["", "has space", "latest:main", "a@b", "-x", "x" * 101])
def test_a_bad_label_is_a_400_naming_the_field(personas, make_run, label):
    run = make_run(personas["owner"].user, status=RunStatus.SUCCEEDED)
    response = mark(personas["owner"], run, label)
    assert response.status_code == 400
    assert error(response)["field"] == "label"


def test_branch_like_labels_are_accepted(personas, make_run):
    run = make_run(personas["owner"].user, status=RunStatus.SUCCEEDED)
    for label in ("release/1.2", "feature_x+y", "v0.32.0"):
        assert mark(personas["owner"], run, label).status_code == 201


# --------------------------------------------------------------------------- resolving


def resolve(persona, ref: str, **params):
    return persona.client.get(RESOLVE, {"ref": ref, **params})


def test_latest_resolves_to_the_newest_succeeded_run_of_the_series(personas, make_run):
    owner = personas["owner"]
    old = aged(make_run(owner.user, status=RunStatus.SUCCEEDED), 30)
    new = aged(make_run(owner.user, status=RunStatus.SUCCEEDED), 20)
    failed = aged(make_run(owner.user, status=RunStatus.SUCCEEDED), 10)
    running = make_run(owner.user, status=RunStatus.RUNNING)
    unmarked = make_run(owner.user, status=RunStatus.SUCCEEDED)
    for run in (old, new, failed, running):
        assert mark(owner, run).status_code == 201
    Run.objects.filter(pk=failed.pk).update(status=RunStatus.FAILED)
    assert old.fingerprint == new.fingerprint == unmarked.fingerprint

    found = resolve(owner, "latest:main", fingerprint=old.fingerprint)
    assert found.status_code == 200, found.content
    assert found.json()["id"] == new.public_id  # not the failed, running or unmarked ones
    # Without a fingerprint: one series carries the label, so it is unambiguous.
    assert resolve(owner, "latest:main").json()["id"] == new.public_id
    # `before` a run: only older ones (a candidate never resolves to itself).
    before = resolve(owner, "latest:main", fingerprint=old.fingerprint, before=new.public_id)
    assert before.json()["id"] == old.public_id
    # Unmarking the newest makes the previous one the baseline again.
    gone = owner.client.delete(f"/api/v1/runs/{new.public_id}/baseline?label=main")
    assert gone.status_code == 204
    assert resolve(owner, "latest:main").json()["id"] == old.public_id
    again = owner.client.delete(f"/api/v1/runs/{new.public_id}/baseline?label=main")
    assert again.status_code == 404


def test_latest_is_per_series_and_per_label(personas, make_run, spec_dict):
    owner = personas["owner"]
    a = make_run(owner.user, status=RunStatus.SUCCEEDED)
    other_workload = spec_dict(
        workload={"input_len": 128, "output_len": 16, "num_prompts": 8, "num_warmups": 0}
    )
    b = make_run(owner.user, spec=other_workload, status=RunStatus.SUCCEEDED)
    assert a.fingerprint != b.fingerprint
    mark(owner, a)
    mark(owner, b)
    mark(owner, a, "nightly")
    assert resolve(owner, "latest:main", fingerprint=a.fingerprint).json()["id"] == a.public_id
    assert resolve(owner, "latest:main", fingerprint=b.fingerprint).json()["id"] == b.public_id
    ambiguous = resolve(owner, "latest:main")
    assert ambiguous.status_code == 409
    assert error(ambiguous)["code"] == "ambiguous_ref"
    assert error(ambiguous)["field"] == "fingerprint"
    assert resolve(owner, "latest:nightly").json()["id"] == a.public_id
    missing = resolve(owner, "latest:nightly", fingerprint=b.fingerprint)
    assert missing.status_code == 404
    message = error(missing)["message"]
    assert "1 other series" in message and "servebench label RUN nightly" in message


def test_latest_never_picks_another_users_run(personas, make_run):
    theirs = make_run(personas["other"].user, status=RunStatus.SUCCEEDED, is_public=True)
    assert mark(personas["other"], theirs).status_code == 201
    mine = resolve(personas["owner"], "latest:main", fingerprint=theirs.fingerprint)
    assert mine.status_code == 404
    assert error(mine)["code"] == "no_baseline"
    # Asked for by name, their public run is found.
    named = resolve(personas["owner"], "latest:main", owner="other")
    assert named.json()["id"] == theirs.public_id
    assert resolve(personas["anon"], "latest:main", owner="other").status_code == 200
    # A private one is not, even by name.
    Run.objects.filter(pk=theirs.pk).update(is_public=False)
    assert resolve(personas["owner"], "latest:main", owner="other").status_code == 404


def test_anonymous_latest_without_an_owner_is_a_401(personas):
    response = resolve(personas["anon"], "latest:main")
    assert response.status_code == 401
    assert "owner=<username>" in error(response)["message"]


def test_a_run_id_resolves_to_that_run_if_visible(personas, make_run):
    run = make_run(personas["owner"].user)
    assert resolve(personas["owner"], run.public_id).json()["id"] == run.public_id
    assert resolve(personas["other"], run.public_id).status_code == 404
    bad = resolve(personas["owner"], "not a ref!")
    assert bad.status_code == 400 and error(bad)["field"] == "ref"
    assert resolve(personas["owner"], "latest:").status_code == 400


# --------------------------------------------------------------------------- listing


def test_the_list_shows_marks_on_runs_you_can_see(personas, make_run):
    private = make_run(personas["owner"].user, status=RunStatus.SUCCEEDED)
    public = make_run(personas["owner"].user, status=RunStatus.SUCCEEDED, is_public=True)
    mark(personas["owner"], private)
    mark(personas["owner"], public, "nightly")
    owner_view = personas["owner"].client.get("/api/v1/baselines/").json()
    assert owner_view["count"] == 2
    assert {m["label"] for m in owner_view["results"]} == {"main", "nightly"}
    for who in ("other", "anon"):
        seen = personas[who].client.get("/api/v1/baselines/").json()["results"]
        assert [m["run"]["id"] for m in seen] == [public.public_id]
    filtered = personas["owner"].client.get(
        "/api/v1/baselines/", {"label": "main", "fingerprint": private.fingerprint}
    )
    assert [m["run"]["id"] for m in filtered.json()["results"]] == [private.public_id]
    assert personas["owner"].client.get("/api/v1/baselines/?label=a b").status_code == 400


def test_the_list_query_count_does_not_grow_with_marks(
    personas, make_run, django_assert_max_num_queries
):
    for _ in range(5):
        mark(personas["owner"], make_run(personas["owner"].user, status=RunStatus.SUCCEEDED))
    with django_assert_max_num_queries(6):
        response = personas["owner"].client.get("/api/v1/baselines/")
    assert response.json()["count"] == 5


def test_staff_see_baselines_in_the_admin(personas, make_run, make_user):
    run = make_run(personas["owner"].user, status=RunStatus.SUCCEEDED)
    mark(personas["owner"], run)
    admin = Client()
    admin.force_login(make_user("admin", is_staff=True, is_superuser=True))
    assert admin.get("/admin/benchmarks/baseline/").status_code == 200
    pk = Baseline.objects.get().pk
    assert admin.get(f"/admin/benchmarks/baseline/{pk}/change/").status_code == 200
    outsider = Client()
    outsider.force_login(make_user("outsider"))
    assert outsider.get("/admin/benchmarks/baseline/").status_code == 302
