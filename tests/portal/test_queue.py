"""Where a queued run stands: the API, the run page and its live status say it."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.benchmarks.models import Run, RunStatus
from portal.benchmarks.queue import queue_info

pytestmark = pytest.mark.django_db


def test_a_queued_run_knows_how_many_are_ahead_and_the_slots(make_run, personas, settings):
    settings.SERVEBENCH_EXECUTOR = "local"
    settings.SERVEBENCH_LOCAL_SLOTS = 1
    owner = personas["owner"].user
    busy = make_run(owner=owner, status=RunStatus.RUNNING)
    Run.objects.filter(pk=busy.pk).update(holds_slot=True)
    first, second = make_run(owner=owner), make_run(owner=owner)
    assert queue_info(first)["ahead"] == 0
    info = queue_info(second)
    assert (info["position"], info["ahead"], info["slots"], info["busy"]) == (2, 1, 1, 1)
    assert info["message"].startswith("waiting for a free slot: 1 run ahead of it, 1 of 1 slot")
    assert queue_info(busy) is None

    client = personas["owner"].client
    assert client.get(f"/api/v1/runs/{second.public_id}/").json()["queue"] == info
    assert client.get(f"/api/v1/runs/{busy.public_id}/").json()["queue"] is None
    browser = Client()
    browser.force_login(owner)
    page = browser.get(f"/runs/{second.public_id}/").content.decode()
    assert 'id="queue-note"' in page and "1 run ahead of it" in page
    status = browser.get(f"/runs/{second.public_id}/status.json").json()
    assert status["queue"]["ahead"] == 1


def test_on_kubernetes_there_are_no_slots_here(make_run, settings):
    settings.SERVEBENCH_EXECUTOR = "kubernetes"
    run = make_run()
    info = queue_info(run)
    assert info["slots"] is None and info["busy"] is None
    assert info["message"] == "waiting to be dispatched; 0 runs ahead of it"
