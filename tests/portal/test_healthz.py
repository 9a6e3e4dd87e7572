"""/healthz touches the database and reports the broker."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_healthz_is_ok_with_database_and_broker(client, django_assert_num_queries):
    with django_assert_num_queries(1):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"database": "ok", "broker": "ok", "status": "ok"}
    assert "no-cache" in response["Cache-Control"]


def test_healthz_reports_an_unreachable_broker_without_failing(client, settings):
    from portal.celery import app

    good = app.conf.broker_url
    app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    try:
        response = client.get("/healthz")
    finally:
        app.conf.broker_url = good
    assert response.status_code == 200  # runs wait in the database; web keeps serving
    body = response.json()
    assert body["status"] == "degraded"
    assert body["broker"].startswith("unreachable:")


def test_healthz_only_answers_get(client):
    assert client.post("/healthz").status_code == 405
