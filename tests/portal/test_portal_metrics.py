"""The portal's own /metrics: off unless protected by a token or networks, answered
whatever the Host, in Prometheus' text format; gauges and histograms from PostgreSQL,
counters (5xx, refused runner reports) in Redis, so every process counts into one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from django.utils import timezone

import portal.urls
from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.benchmarks.models import Run, RunStatus

pytestmark = pytest.mark.django_db

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "metrics-token-0123456789"


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug")


# This module is the URL conf of the 5xx test: the portal's, plus a view that fails.
urlpatterns = [path("boom/", boom), *portal.urls.urlpatterns]
handler404 = portal.urls.handler404
handler500 = portal.urls.handler500


@pytest.fixture
def scrape(settings: Any) -> Any:
    settings.SERVEBENCH_METRICS_TOKEN = TOKEN

    def get() -> dict[str, float]:
        response = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}").get("/metrics")
        assert response.status_code == 200, response.content
        assert response["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(response.content.decode())

    return get


def parse(text: str) -> dict[str, float]:
    """Sample name with labels -> value (HELP/TYPE lines checked for every family)."""
    samples = {}
    typed = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    for name in samples:
        base = re.sub(r"(_bucket|_sum|_count)$", "", name.split("{")[0])
        assert base in typed or name.split("{")[0] in typed, name
    return samples


def test_metrics_are_off_by_default_and_need_the_token(settings):
    assert Client().get("/metrics").status_code == 404
    settings.SERVEBENCH_METRICS_TOKEN = TOKEN
    assert Client().get("/metrics").status_code == 401
    assert Client(HTTP_AUTHORIZATION="Bearer wrong-token-000000").get("/metrics").status_code == 401
    # Prometheus scrapes pods by address: a Host ALLOWED_HOSTS does not list is fine here.
    scraper = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}", HTTP_HOST="10.42.0.7:8000")
    assert scraper.get("/metrics").status_code == 200
    assert scraper.post("/metrics").status_code == 405
    # ...and only here: the rest of the portal still refuses that Host.
    assert scraper.get("/healthz").status_code == 400


def test_allowed_networks_scrape_without_a_token(settings):
    settings.SERVEBENCH_METRICS_NETWORKS = ["10.0.0.0/8"]
    assert Client(REMOTE_ADDR="10.2.3.4").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="192.0.2.1").get("/metrics").status_code == 401


def test_queue_depth_dispatch_latency_and_durations_come_from_the_database(
    make_run, scrape, settings
):
    settings.SERVEBENCH_EXECUTOR = "local"
    before = scrape()
    now = timezone.now()
    make_run()  # queued
    make_run()
    dispatched = make_run()
    Run.objects.filter(pk=dispatched.pk).update(
        status=RunStatus.RUNNING,
        executor="local",
        dispatched_at=dispatched.created_at + timedelta(seconds=7),
    )
    ended = make_run()
    Run.objects.filter(pk=ended.pk).update(
        status=RunStatus.SUCCEEDED,
        executor="local",
        dispatched_at=ended.created_at + timedelta(seconds=2),
        started_at=now - timedelta(minutes=20),
        finished_at=now,
    )
    after = scrape()
    assert after['servebench_runs{executor="local",status="queued"}'] == 2
    assert after['servebench_runs{executor="local",status="running"}'] == 1
    assert (
        after['servebench_slots{executor="local",state="total"}'] == settings.SERVEBENCH_LOCAL_SLOTS
    )

    def delta(key: str) -> float:
        return after[key] - before.get(key, 0)

    latency = "servebench_dispatch_latency_seconds"
    assert delta(f"{latency}_count") == 2
    assert delta(f'{latency}_bucket{{le="5"}}') == 1  # the 2 s one
    assert delta(f'{latency}_bucket{{le="15"}}') == 2  # and the 7 s one
    assert delta(f"{latency}_sum") == pytest.approx(9, abs=0.01)
    duration = "servebench_run_duration_seconds"
    assert delta(f'{duration}_count{{outcome="succeeded"}}') == 1
    assert delta(f'{duration}_bucket{{outcome="succeeded",le="600"}}') == 0
    assert delta(f'{duration}_bucket{{outcome="succeeded",le="1800"}}') == 1
    assert f'{duration}_count{{outcome="failed"}}' in after


def test_server_errors_and_refused_runner_reports_are_counted(make_run, scrape, settings):
    before = scrape()
    settings.ROOT_URLCONF = __name__
    settings.DEBUG = False
    assert Client(raise_request_exception=False).get("/boom/").status_code == 500
    run = make_run(status=RunStatus.RUNNING)
    token = issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run).plaintext
    runner = Client(headers={"Authorization": f"Bearer {token}"})
    body = {"type": "progress", "done": -5}
    refused = runner.post(
        f"/api/v1/runner/runs/{run.public_id}/events",
        json.dumps(body),
        content_type="application/json",
    )
    assert refused.status_code == 400
    after = scrape()
    assert (
        after['servebench_http_5xx_total{status="500"}']
        - before.get('servebench_http_5xx_total{status="500"}', 0)
        == 1
    )
    key = 'servebench_ingestion_refusals_total{field="done"}'
    assert after[key] - before.get(key, 0) == 1
    assert after["servebench_counters_up"] == 1


def test_every_process_counts_into_the_same_counters(scrape):
    """gunicorn's workers are processes: a count made in another one shows here."""
    before = scrape().get('servebench_http_5xx_total{status="503"}', 0)
    code = (
        "import django; django.setup(); from portal.ops import counters; "
        "counters.add('http_5xx', '503'); counters.add('http_5xx', '503')"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(os.environ), check=True,
                   timeout=120)  # fmt: skip
    assert scrape()['servebench_http_5xx_total{status="503"}'] - before == 2


def test_refused_fields_become_labels_of_bounded_variety():
    from portal.ops.metrics import refusal_label

    assert refusal_label("point.key") == "point.key"
    assert refusal_label("errors.17.message") == "errors.N.message"
    assert refusal_label("metrics.My Metric!") == "metrics.*"
    assert refusal_label("commands.serve.extra.deep") == "commands.serve.extra"
    assert refusal_label("") == "body"
