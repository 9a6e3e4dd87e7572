"""Fair use: limits on queued and running runs and on GPU-hours, per user and per CI token,
set by the settings and overridden by an admin; priorities the dispatcher honours; and
the refusals, which name the limit, the usage and when it frees up (API and web form)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone
from racing import at_once

from portal.accounts.models import ApiToken, Quota
from portal.accounts.quotas import QuotaExceeded
from portal.accounts.tokens import create_user_token
from portal.benchmarks import intake
from portal.benchmarks.models import Run, RunStatus
from portal.benchmarks.queue import queue_info
from portal.dispatch import dispatcher
from portal.dispatch.executors.local import LocalExecutor

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs/"


def spec(gpus: int = 0, timeout: int = 10, name: str = "fair") -> dict[str, Any]:
    return {
        "name": name,
        "model": {"id": "org/tiny-model", "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 4, "num_warmups": 0},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1]}],
        "backends": [{"kind": "vllm"}],
        "resources": {"gpu_count": gpus, "timeout_minutes": timeout},
    }


def post(client: Client, body: dict[str, Any]) -> Any:
    return client.post(RUNS, json.dumps({"spec": body}), content_type="application/json")


def test_a_user_over_their_active_runs_is_refused_naming_the_limit(personas, settings):
    settings.SERVEBENCH_QUOTA_ACTIVE_RUNS = 2
    owner = personas["owner"].client
    ids = [post(owner, spec()).json()["id"] for _ in range(2)]
    refused = post(owner, spec())
    assert refused.status_code == 409, refused.content
    error = refused.json()
    assert error["error"]["code"] == "quota_exceeded"
    assert "2 queued or running runs; the limit is 2" in error["error"]["message"]
    assert error["quota"] == {
        "limit": "active_runs",
        "scope": "user",
        "allowed": 2,
        "used": 2,
        "requested": 1,
        "frees_at": None,
    }
    assert Run.objects.filter(owner=personas["owner"].user).count() == 2  # nothing stored
    # One ends: a place frees up. Other users were never limited by this one.
    assert owner.post(f"{RUNS}{ids[0]}/cancel").status_code == 202
    assert post(owner, spec()).status_code == 201
    assert post(personas["other"].client, spec()).status_code == 201


def test_each_ci_token_has_its_own_limit_and_the_admin_can_raise_it(personas, settings):
    settings.SERVEBENCH_QUOTA_TOKEN_ACTIVE_RUNS = 1
    owner = personas["owner"]
    assert post(owner.client, spec()).status_code == 201
    refused = post(owner.client, spec())
    assert refused.status_code == 409
    assert refused.json()["quota"]["scope"] == "token"
    assert "token sb_ci_" in refused.json()["error"]["message"]
    # Another pipeline's token of the same user is counted apart.
    second = create_user_token(owner.user, "nightly")
    other_pipeline = Client(headers={"Authorization": f"Bearer {second.plaintext}"})
    assert post(other_pipeline, spec()).status_code == 201
    # An admin raises the first token's limit.
    ApiToken.objects.filter(user=owner.user, name="tests").update(max_active_runs=3)
    assert post(owner.client, spec()).status_code == 201
    run = Run.objects.filter(owner=owner.user).order_by("-id").first()
    assert run.api_token.name == "tests"


def test_gpu_hours_count_requests_while_active_and_held_time_once_ended(personas, settings):
    settings.SERVEBENCH_QUOTA_GPU_HOURS = 4
    settings.SERVEBENCH_LOCAL_GPUS = 8
    owner = personas["owner"].client
    first = post(owner, spec(gpus=1, timeout=120)).json()["id"]  # may take 2 GPU-hours
    assert post(owner, spec(gpus=1, timeout=120)).status_code == 201  # 4 of 4
    refused = post(owner, spec(gpus=1, timeout=120))
    assert refused.status_code == 409
    quota = refused.json()["quota"]
    assert (quota["limit"], quota["used"], quota["requested"]) == ("gpu_hours_per_day", 4.0, 2.0)
    assert quota["frees_at"] is None  # only the active runs' ends would free it
    assert "as your queued and running runs end" in refused.json()["error"]["message"]
    assert post(owner, spec(gpus=0, timeout=600)).status_code == 201  # CPU runs cost nothing

    # The first one ended after holding its GPU 30 minutes, 23 hours ago: it is charged
    # 0.5 GPU-hours until it leaves the window, an hour from now.
    now = timezone.now()
    Run.objects.filter(public_id=first).update(
        status=RunStatus.SUCCEEDED,
        created_at=now - timedelta(hours=23),
        dispatched_at=now - timedelta(hours=23),
        finished_at=now - timedelta(hours=22, minutes=30),
    )
    refused = post(owner, spec(gpus=1, timeout=120))
    assert refused.status_code == 409
    quota = refused.json()["quota"]
    assert quota["used"] == 2.5
    frees_at = timezone.datetime.fromisoformat(quota["frees_at"])
    assert abs((frees_at - (now + timedelta(hours=1))).total_seconds()) < 5
    assert 3500 <= int(refused["Retry-After"]) <= 3610
    assert "enough frees up at" in refused.json()["error"]["message"]
    # A run that alone exceeds the day's limit never fits: 403 naming the field to change.
    never = post(owner, spec(gpus=1, timeout=300))
    assert never.status_code == 403
    assert never.json()["error"]["field"] == "spec.resources.timeout_minutes"


def test_an_admins_quota_overrides_the_defaults(personas, settings):
    settings.SERVEBENCH_QUOTA_ACTIVE_RUNS = 1
    user = personas["owner"].user
    quota = Quota.objects.create(user=user, max_active_runs=2, note="team lead")
    client = personas["owner"].client
    assert [post(client, spec()).status_code for _ in range(3)] == [201, 201, 409]
    quota.unlimited = True
    quota.save()
    assert post(client, spec()).status_code == 201
    Quota.objects.filter(pk=quota.pk).update(unlimited=False, max_active_runs=0)
    refused = post(client, spec())
    assert refused.status_code == 403  # none allowed: waiting would not help
    assert refused.json()["quota"]["allowed"] == 0


def test_the_form_says_why_a_run_was_not_queued_and_shows_the_usage(make_user, settings):
    settings.SERVEBENCH_QUOTA_ACTIVE_RUNS = 1
    settings.SERVEBENCH_EXECUTOR = "local"
    user = make_user("formuser")
    browser = Client()
    browser.force_login(user)
    page = browser.get("/runs/new/").content.decode()
    assert 'id="quota-usage"' in page and "0 of 1 queued or running runs" in page
    with transaction.atomic():
        intake.create_run(user, spec())
    form = browser.get("/runs/new/").context["form"]
    data = {k: v for k, v in form.initial.items() if v is not None and k != "is_public"}
    response = browser.post("/runs/new/", {**data, "preset": "", "spec_text": json.dumps(spec())})
    assert response.status_code == 409
    text = response.content.decode()
    assert 'id="quota-refused"' in text and "the limit is 1" in text
    assert "1 of 1 queued or running run" in text
    assert Run.objects.filter(owner=user).count() == 1


def test_the_quota_endpoint_reports_limits_and_usage(personas, settings):
    settings.SERVEBENCH_QUOTA_ACTIVE_RUNS = 7
    Quota.objects.create(user=personas["owner"].user, priority=3)
    post(personas["owner"].client, spec())
    assert personas["owner"].client.get("/api/v1/quota/").json() == {
        "active_runs": 1,
        "active_limit": 7,
        "gpu_hours": 0.0,
        "gpu_hours_limit": None,
        "priority": 3,
    }
    assert personas["other"].client.get("/api/v1/quota/").json()["active_runs"] == 0
    assert personas["anon"].client.get("/api/v1/quota/").status_code == 401


@pytest.fixture
def exits_at_once(tmp_path):
    """A runner interpreter that exits at once: the real executor starts it, no benchmark."""
    path = tmp_path / "runner-python"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_the_dispatcher_takes_higher_priority_first_then_oldest(
    make_user, settings, tmp_path, exits_at_once
):
    settings.SERVEBENCH_EXECUTOR = "local"
    settings.SERVEBENCH_LOCAL_SLOTS = 1
    alice, bob, vip = make_user("alice"), make_user("bob"), make_user("vip")
    Quota.objects.create(user=vip, priority=10)
    with transaction.atomic():
        old = intake.create_run(alice, spec(name="old"))
        newer = intake.create_run(bob, spec(name="newer"))
        urgent = intake.create_run(vip, spec(name="urgent"))
    assert (old.priority, newer.priority, urgent.priority) == (0, 0, 10)
    assert queue_info(urgent)["ahead"] == 0
    assert queue_info(old)["ahead"] == 1 and queue_info(newer)["ahead"] == 2
    assert "(priority 10)" in queue_info(urgent)["message"]

    executor = LocalExecutor(python=exits_at_once, data_dir=tmp_path / "data", slots=1)
    outcomes = dispatcher.fill_slots(executor)
    assert outcomes[urgent.pk] == "submitted" and outcomes.get("waiting") == "1"
    statuses = dict(Run.objects.values_list("name", "status"))
    assert statuses == {"old": "queued", "newer": "queued", "urgent": "dispatched"}
    # Within one priority, first come first served: the old run is next.
    Run.objects.filter(pk=urgent.pk).update(status=RunStatus.SUCCEEDED, holds_slot=False)
    assert old.pk in dispatcher.fill_slots(executor)


@pytest.mark.django_db(transaction=True)
def test_two_submits_at_once_cannot_both_take_the_last_place(make_user, settings):
    settings.SERVEBENCH_QUOTA_ACTIVE_RUNS = 1
    user = make_user("racer")
    outcomes = at_once(lambda: intake.create_run(user, spec()), 2)
    results = ["refused" if isinstance(o, QuotaExceeded) else "created" for o in outcomes]
    assert sorted(results) == ["created", "refused"]
    assert Run.objects.filter(owner=user).count() == 1


def test_a_token_priority_outranks_its_owners(personas):
    owner = personas["owner"]
    Quota.objects.create(user=owner.user, priority=1)
    ApiToken.objects.filter(user=owner.user).update(priority=-5)  # a bulk CI pipeline
    body = post(owner.client, spec()).json()
    assert Run.objects.get(public_id=body["id"]).priority == -5
    with transaction.atomic():  # the web form's runs (no token) keep the owner's priority
        run = intake.create_run(owner.user, spec())
    assert run.priority == 1
