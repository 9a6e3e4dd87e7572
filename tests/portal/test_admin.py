"""The Django admin lists and shows every model; only staff get in."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.accounts.tokens import create_user_token
from portal.benchmarks import environment, ingestion
from portal.benchmarks.models import Environment, Measurement, RunStatus
from runners.result import Measurement as RunnerMeasurement

pytestmark = pytest.mark.django_db


@pytest.fixture
def populated(make_run, make_user, measurement):
    run = make_run(status=RunStatus.RUNNING)
    ingestion.ingest_measurement(run, RunnerMeasurement.model_validate(measurement()))
    environment.store_environment(run, {"gpu": {"model": "L4", "count": 1}}, "f" * 64)
    token = create_user_token(run.owner, "ci").token
    return {
        "run": run,
        "measurement": Measurement.objects.get(run=run),
        "environment": Environment.objects.get(run=run),
        "apitoken": token,
    }


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("benchmarks/run", "run"),
        ("benchmarks/measurement", "measurement"),
        ("benchmarks/environment", "environment"),
        ("accounts/apitoken", "apitoken"),
    ],
)
def test_staff_see_every_model_and_others_are_sent_to_sign_in(
    populated, make_user, model, key, django_assert_max_num_queries
):
    admin = Client()
    admin.force_login(make_user("admin", is_staff=True, is_superuser=True))
    with django_assert_max_num_queries(12):
        listing = admin.get(f"/admin/{model}/")
    assert listing.status_code == 200
    assert admin.get(f"/admin/{model}/{populated[key].pk}/change/").status_code == 200
    outsider = Client()
    outsider.force_login(make_user("outsider"))
    assert outsider.get(f"/admin/{model}/").status_code == 302
    assert Client().get(f"/admin/{model}/").status_code == 302


def test_tokens_are_not_typed_in_through_the_admin(populated, make_user):
    admin = Client()
    admin.force_login(make_user("admin", is_staff=True, is_superuser=True))
    assert admin.get("/admin/accounts/apitoken/add/").status_code == 403
