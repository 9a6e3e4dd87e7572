"""Schedules: a spec submitted on a cadence through the normal intake and labelled into a
series; each slot fires once (two ticks at once, a real beat and worker); a refused
submit is recorded and notifies; the run page says which schedule made the run."""

from __future__ import annotations

import json
from datetime import UTC, datetime, time, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from racing import at_once

from portal.alerts.models import Delivery, Subscription
from portal.benchmarks.models import Baseline, Run
from portal.schedules import cadence, editing, firing
from portal.schedules.models import Firing, Schedule

API = "/api/v1/schedules/"


def spec(name: str = "scheduled") -> dict[str, Any]:
    return {
        "name": name,
        "model": {"id": "org/tiny-model", "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 4, "num_warmups": 0},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1]}],
        "backends": [{"kind": "vllm"}],
        "resources": {"gpu_count": 0, "timeout_minutes": 10},
    }


def body(**overrides: Any) -> dict[str, Any]:
    return {"name": "nightly", "label": "nightly", "spec": spec(), "cadence": "daily",
            "at": "02:30"} | overrides  # fmt: skip


def create(client: Client, **overrides: Any) -> Any:
    return client.post(API, json.dumps(body(**overrides)), content_type="application/json")


def due_now(schedule: Schedule) -> Schedule:
    past = timezone.now() - timedelta(minutes=1)
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=past)
    schedule.refresh_from_db()
    return schedule


def test_slots_are_daily_or_every_n_hours_on_a_fixed_grid():
    after = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
    assert cadence.next_slot("daily", time(2, 30), None, after) == datetime(
        2026, 12, 2, 2, 30, tzinfo=UTC
    )
    assert cadence.next_slot("daily", time(4, 0), None, after) == after.replace(hour=4)
    assert cadence.next_slot("hours", time(0, 0), 4, after) == after.replace(hour=4)
    # Strictly after: a slot that is due now is the one after it next time.
    assert cadence.next_slot("hours", time(0, 0), 4, after.replace(hour=4)) == after.replace(hour=8)
    assert cadence.next_slot("hours", time(1, 15), 6, after) == after.replace(hour=7, minute=15)
    with pytest.raises(ValueError):
        cadence.next_slot("hours", time(0, 0), 0, after)


@pytest.mark.django_db
def test_schedules_through_the_api_owner_other_and_anonymous(personas, settings):
    settings.SERVEBENCH_EXECUTOR = "local"
    owner, other, anon = personas["owner"], personas["other"], personas["anon"]
    made = create(owner.client, cadence="hours", every_hours=4, at="00:00")
    assert made.status_code == 201, made.content
    row = made.json()
    assert row["description"] == "every 4 h from 00:00 UTC" and row["enabled"] is True
    assert datetime.fromisoformat(row["next_run_at"]).hour % 4 == 0
    url = f"{API}{row['id']}/"
    assert owner.client.get(url).status_code == 200
    assert other.client.get(url).status_code == 404
    assert other.client.get(API).json() == []
    assert (
        other.client.patch(url, {"enabled": False}, content_type="application/json").status_code
        == 404
    )
    assert other.client.delete(url).status_code == 404
    assert anon.client.get(API).status_code == 401
    assert create(anon.client).status_code == 401

    paused = owner.client.patch(url, {"enabled": False}, content_type="application/json")
    assert paused.status_code == 200 and paused.json()["enabled"] is False
    bad_patch = owner.client.patch(url, {"label": "x"}, content_type="application/json")
    assert bad_patch.status_code == 400 and bad_patch.json()["error"]["field"] == "enabled"
    assert owner.client.get(f"{url}firings").json() == []
    assert owner.client.delete(url).status_code == 204
    assert not Schedule.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("overrides", "status", "field"),
    [
        ({"at": "25:00"}, 400, "at"),
        ({"cadence": "weekly"}, 400, "cadence"),
        ({"cadence": "hours", "every_hours": 0}, 400, "every_hours"),
        ({"label": "no spaces"}, 400, "label"),
        ({"spec": spec() | {"workload": {"input_len": 0}}}, 400, "spec.workload.input_len"),
        ({"spec": "name: [unclosed"}, 400, "spec"),
        ({"spec": spec() | {"model": {"id": "org/x", "trust_remote_code": True}}}, 403,
         "spec.model.trust_remote_code"),
        ({"bogus": 1}, 400, "bogus"),
    ],
)  # fmt: skip
def test_a_bad_schedule_is_refused_naming_the_field(personas, settings, overrides, status, field):
    settings.SERVEBENCH_EXECUTOR = "local"
    refused = create(personas["owner"].client, **overrides)
    assert refused.status_code == status, refused.content
    assert refused.json()["error"]["field"] == field
    assert not Schedule.objects.exists()


@pytest.mark.django_db
def test_a_schedule_that_could_never_run_is_refused_at_once(personas, settings):
    settings.SERVEBENCH_QUOTA_GPU_HOURS = 1
    settings.SERVEBENCH_LOCAL_GPUS = 2
    settings.SERVEBENCH_EXECUTOR = "local"
    big = spec() | {"resources": {"gpu_count": 2, "timeout_minutes": 60}}
    refused = create(personas["owner"].client, spec=big)
    assert refused.status_code == 403
    assert "could never run" in refused.json()["error"]["message"]
    settings.SERVEBENCH_SCHEDULES_PER_USER = 1
    assert create(personas["owner"].client).status_code == 201
    assert create(personas["owner"].client).status_code == 409


@pytest.mark.django_db(transaction=True)
def test_a_due_slot_fires_once_whatever_ticks_at_once(make_user, settings):
    settings.SERVEBENCH_EXECUTOR = "local"
    owner = make_user("nightly-owner")
    schedule = due_now(editing.create(owner, body()))
    slot = schedule.next_run_at
    reports = at_once(firing.tick, 4)
    submitted = [run for report in reports for run in report["submitted"]]
    assert len(submitted) == 1, reports
    (made,) = Firing.objects.filter(schedule=schedule)
    assert made.due_at == slot and made.run.public_id == submitted[0]
    run = made.run
    assert run.name == f"nightly ({slot:%Y-%m-%d %H:%M} UTC)" and run.status == "queued"
    assert Baseline.objects.filter(run=run, label="nightly").exists()  # into the series
    schedule.refresh_from_db()
    assert schedule.last_run_id == run.pk and schedule.last_error == ""
    assert schedule.next_run_at > timezone.now()
    assert schedule.next_run_at.time() == time(2, 30)
    assert firing.tick()["submitted"] == []  # nothing due any more


@pytest.mark.django_db
def test_a_refused_submit_is_recorded_and_notifies(personas, settings):
    settings.SERVEBENCH_EXECUTOR = "local"
    settings.SERVEBENCH_WEBHOOK_HOSTS = ["hooks.example.com"]
    owner = personas["owner"]
    Subscription.objects.create(
        user=owner.user,
        series_owner=owner.user,
        label="nightly",
        channel="webhook",
        target="https://hooks.example.com/x",
    )
    schedule = due_now(editing.create(owner.user, body()))
    settings.SERVEBENCH_QUOTA_ACTIVE_RUNS = 1
    owner.client.post(
        "/api/v1/runs/", json.dumps({"spec": spec()}), content_type="application/json"
    )  # the one place is taken
    report = firing.tick()
    assert report == {"submitted": [], "refused": [schedule.public_id]}
    schedule.refresh_from_db()
    assert schedule.last_error.startswith("fair use: your account has 1 queued or running runs")
    (fired,) = schedule.firings.all()
    assert fired.run is None and fired.refusal == schedule.last_error
    (told,) = Delivery.objects.all()
    assert told.event == "schedule_refused" and "could not submit" in told.payload["text"]
    assert told.payload["schedule"]["id"] == schedule.public_id
    listed = owner.client.get(f"{API}{schedule.public_id}/firings").json()
    assert listed[0]["run"] is None and listed[0]["refusal"].startswith("fair use")


@pytest.mark.django_db
def test_the_pages_create_pause_and_name_the_schedule_on_its_runs(make_user, settings):
    settings.SERVEBENCH_EXECUTOR = "local"
    owner = make_user("pageowner")
    browser = Client()
    browser.force_login(owner)
    form = {"name": "every four", "label": "h4", "cadence": "hours", "at": "00:00",
            "every_hours": "4", "spec": json.dumps(spec())}  # fmt: skip
    made = browser.post("/schedules/", form)
    assert made.status_code == 302
    schedule = Schedule.objects.get()
    page = browser.get(made["Location"]).content.decode()
    assert "every 4 h from 00:00 UTC" in page and 'id="pause"' in page
    bad = browser.post("/schedules/", form | {"at": "9am"})
    assert bad.status_code == 400 and "HH:MM" in bad.content.decode()
    browser.post(f"/schedules/{schedule.public_id}/action", {"action": "pause"})
    schedule.refresh_from_db()
    assert not schedule.enabled
    assert "paused" in browser.get("/schedules/").content.decode()
    browser.post(f"/schedules/{schedule.public_id}/action", {"action": "resume"})
    schedule = due_now(Schedule.objects.get())
    firing.tick()
    run = Run.objects.get()
    shown = browser.get(run.get_absolute_url()).content.decode()
    assert 'id="made-by-schedule"' in shown
    assert "Submitted by the schedule &#x27;every four&#x27; (every 4 h from 00:00 UTC)" in shown
    assert f"/schedules/{schedule.public_id}/" in shown
    # Someone else sees neither the schedule's page nor its actions.
    stranger = Client()
    stranger.force_login(make_user("stranger"))
    assert stranger.get(f"/schedules/{schedule.public_id}/").status_code == 404
    assert (
        stranger.post(f"/schedules/{schedule.public_id}/action", {"action": "delete"}).status_code
        == 404
    )
    browser.post(f"/schedules/{schedule.public_id}/action", {"action": "delete"})
    assert not Schedule.objects.exists() and Run.objects.filter(pk=run.pk).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_beat_and_the_worker_submit_and_dispatch_a_due_schedule(
    make_user, celery_worker, waiter, tmp_path, settings
):
    settings.SERVEBENCH_EXECUTOR = "local"
    runner = tmp_path / "runner-python"
    runner.write_text("#!/bin/sh\nexit 0\n")
    runner.chmod(0o755)
    owner = make_user("beat-owner")
    schedule = due_now(editing.create(owner, body(cadence="hours", every_hours=1)))
    celery_worker(
        beat=True,
        extra_env={
            "SERVEBENCH_TICK_SECONDS": "1",
            "SERVEBENCH_RUNNER_PYTHON": str(runner),
            "SERVEBENCH_DATA_DIR": str(tmp_path / "data"),
        },
    )
    fired = waiter(lambda: Firing.objects.filter(schedule=schedule).first(), 90, "the firing")
    run = fired.run
    assert run is not None and fired.refusal == ""
    waiter(
        lambda: Run.objects.filter(pk=run.pk).exclude(status="queued").exists(),
        90,
        "the worker to dispatch the scheduled run",
    )
    assert Firing.objects.filter(schedule=schedule).count() == 1  # ticks kept coming
    assert Run.objects.filter(owner=owner).count() == 1
