"""The team pages in headless Chromium: schedules (create one through the form, see it
listed with its next run), alerts (subscribe, the secret shown once) and the staff
storage page, at a desktop and a phone width, never wider than the window, no console
error; screenshots land in artifacts/screenshots/."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
SPEC = {
    "name": "nightly tiny",
    "model": {"id": "org/tiny-model", "max_model_len": 512},
    "workload": {"input_len": 64, "output_len": 16, "num_prompts": 4, "num_warmups": 0},
    "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1, 4]}],
    "backends": [{"kind": "vllm"}],
    "resources": {"gpu_count": 0, "timeout_minutes": 10},
}


def fits(page: Any) -> None:
    scroll, client = page.page.evaluate(WIDTH)
    assert scroll <= client + 1, f"the page is {scroll} px wide in a {client} px window"


def test_schedules_alerts_and_storage_pages(page: Any, make_user: Any, settings: Any) -> None:
    settings.SERVEBENCH_EXECUTOR = "local"
    settings.SERVEBENCH_WEBHOOK_HOSTS = ["hooks.example.com"]
    make_user("ops", is_staff=True)
    page.sign_in("ops", "pw-ops")

    page.goto("/schedules/")
    page.page.fill("#id_name", "nightly tiny")
    page.page.fill("#id_label", "nightly")
    page.page.select_option("#id_cadence", "hours")
    page.page.fill("#id_at", "01:00")
    page.page.fill("#id_every_hours", "4")
    page.page.fill("#id_spec", json.dumps(SPEC, indent=2))
    page.page.click("#schedule-form button[type=submit]")
    page.page.wait_for_url(lambda url: "/schedules/" in url and url.rstrip("/").count("/") > 3)
    assert "every 4 h from 01:00 UTC" in page.page.inner_text("main")
    assert page.page.is_visible("#next-run")
    page.shot("schedule-desktop")
    page.goto("/schedules/")
    assert "nightly tiny" in page.page.inner_text("#schedules")
    page.shot("schedules-desktop")

    page.goto("/alerts/")
    page.page.fill("#id_label", "nightly")
    page.page.select_option("#id_channel", "webhook")
    page.page.fill("#id_target", "https://hooks.example.com/bench")
    page.page.click("#subscribe-form button[type=submit]")
    page.page.wait_for_selector("#new-secret")
    assert page.page.inner_text("#secret-value").startswith("whsec_")
    assert "ops:nightly" in page.page.inner_text("#subscriptions")
    page.shot("alerts-desktop")

    page.goto("/staff/storage/")
    assert page.page.is_visible("#objects") and page.page.is_visible("#tables")
    page.shot("storage-desktop")

    page.page.set_viewport_size({"width": 390, "height": 844})
    for path, name in (("/schedules/", "schedules"), ("/alerts/", "alerts"),
                       ("/staff/storage/", "storage")):  # fmt: skip
        page.goto(path)
        fits(page)
        page.shot(f"{name}-phone")
    assert page.console_errors == []
