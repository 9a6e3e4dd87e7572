"""Retention: per-request samples, telemetry and runner logs are deleted the admin's number
of days after a run ended (aggregates stay), the run is marked, its pages say so instead
of failing, and staff see the storage used. The daily task runs in the real worker."""

from __future__ import annotations

from datetime import timedelta

import pytest
import webdata
from django.core.files.storage import storages
from django.test import Client
from django.utils import timezone

from portal.benchmarks import compare, samples, samplestore
from portal.benchmarks.models import Measurement, Run
from portal.celery import app
from portal.ops import retention


def ended_days_ago(run: Run, days: int) -> Run:
    Run.objects.filter(pk=run.pk).update(finished_at=timezone.now() - timedelta(days=days))
    run.refresh_from_db()
    return run


def stored(run: Run) -> list[str]:
    return list(
        Measurement.objects.filter(run=run).exclude(samples="").values_list("samples", flat=True)
    )


def with_telemetry(run: Run) -> list[str]:
    names = stored(run)
    for name in names:
        samplestore.save(samplestore.telemetry_name(name), {"window": [0, 1], "server": {}})
    return names


def exists(name: str) -> bool:
    return storages[samplestore.STORAGE].exists(name)


@pytest.mark.django_db
def test_expired_samples_go_telemetry_stays_longer_and_pages_say_so(make_user, settings):
    settings.SERVEBENCH_RETAIN_SAMPLES_DAYS = 30
    settings.SERVEBENCH_RETAIN_TELEMETRY_DAYS = 90
    owner = make_user("keeper")
    old = ended_days_ago(webdata.make_sweep_run(owner, [1, 4], seed=1), 40)
    recent = ended_days_ago(webdata.make_sweep_run(owner, [1, 4], seed=2), 5)
    names = with_telemetry(old)
    assert names and all(exists(n) for n in names) and stored(recent)

    report = retention.purge()
    assert report.samples == [old.public_id] and report.telemetry == [] and report.errors == []
    assert not any(exists(n) for n in names)
    assert all(exists(samplestore.telemetry_name(n)) for n in names)
    assert all(exists(n) for n in stored(recent))
    old.refresh_from_db()
    assert old.samples_expired_at is not None and old.telemetry_expired_at is None
    # The aggregates stay: every measurement and its summary metrics.
    assert Measurement.objects.filter(run=old, output_throughput__isnull=False).count() >= 3
    assert all(
        arrays == {} for arrays in samples.details(Measurement.objects.filter(run=old)).values()
    )
    assert retention.purge().samples == []  # marked: never looked at twice

    browser = Client()
    browser.force_login(owner)
    page = browser.get(old.get_absolute_url())
    assert page.status_code == 200
    day = f"{old.samples_expired_at:%Y-%m-%d}"
    assert f"Per-request samples expired on {day} (retention 30 days)." in page.content.decode()
    # Compare and the verdict keep working on the summaries.
    result = compare.compare(owner, [recent.public_id, old.public_id], recent.public_id)
    assert result.columns[1].comparable

    ended_days_ago(old, 100)
    assert retention.purge().telemetry == [old.public_id]
    assert not any(exists(samplestore.telemetry_name(n)) for n in names)


@pytest.mark.django_db
def test_local_runner_logs_are_deleted_only_where_the_executor_keeps_them(
    make_run, settings, tmp_path
):
    settings.SERVEBENCH_RETAIN_LOGS_DAYS = 7
    settings.SERVEBENCH_DATA_DIR = tmp_path / "data"
    runs_dir = tmp_path / "data" / "runs"
    ours = make_run(status="failed")
    workdir = runs_dir / ours.public_id
    (workdir / "work").mkdir(parents=True)
    (workdir / "runner.log").write_text("a runner's log\n")
    Run.objects.filter(pk=ours.pk).update(
        executor="local", executor_handle={"workdir": str(workdir)}
    )
    elsewhere = tmp_path / "not-a-run-dir"
    elsewhere.mkdir()
    odd = make_run(status="failed")
    Run.objects.filter(pk=odd.pk).update(
        executor="local", executor_handle={"workdir": str(elsewhere)}
    )
    active = make_run(status="running")
    for run in (ours, odd, active):
        ended_days_ago(run, 30)

    report = retention.purge()
    assert report.logs == [ours.public_id]
    assert not workdir.exists() and elsewhere.exists()
    assert len(report.errors) == 1 and "refusing to delete" in report.errors[0]
    assert Run.objects.get(pk=ours.pk).logs_expired_at is not None
    assert Run.objects.get(pk=odd.pk).logs_expired_at is None
    assert Run.objects.get(pk=active.pk).logs_expired_at is None  # active: never


@pytest.mark.django_db
def test_nothing_is_deleted_by_default(make_user):
    run = ended_days_ago(webdata.make_sweep_run(make_user("forever"), [1], seed=1), 3650)
    empty = {"samples": [], "telemetry": [], "logs": [], "errors": [], "pages": 0}
    assert vars(retention.purge()) == empty
    assert all(exists(n) for n in stored(run))


@pytest.mark.django_db
def test_kept_compare_and_history_pages_are_computed_again_after_their_days(make_user, settings):
    """A compare a reader opened is kept in Postgres; the daily pass deletes it once older
    than SERVEBENCH_KEPT_PAGES_DAYS (its next reader computes it), never a run's own page."""
    from django.core.cache import caches

    from portal.web.models import StoredPage

    owner = make_user("alice")
    a, b = (webdata.make_sweep_run(owner, [1, 4], seed=i) for i in range(2))
    client = Client()
    client.force_login(owner)
    assert client.get(a.get_absolute_url()).status_code == 200
    url = f"/compare/?runs={a.public_id},{b.public_id}&reference={a.public_id}"
    assert client.get(url).status_code == 200
    kinds = sorted(s.split(":")[1] for s in StoredPage.objects.values_list("subject", flat=True))
    assert kinds == ["compare", "run"]
    settings.SERVEBENCH_KEPT_PAGES_DAYS = 30
    assert retention.purge(timezone.now() + timedelta(days=29)).pages == 0
    assert retention.purge(timezone.now() + timedelta(days=31)).pages == 1
    assert [s.split(":")[1] for s in StoredPage.objects.values_list("subject", flat=True)] == [
        "run"
    ]
    caches["pages"].clear()
    assert client.get(url).status_code == 200  # computed again, kept again
    assert StoredPage.objects.count() == 2


def test_staff_see_the_storage_used(make_user, settings):
    settings.SERVEBENCH_RETAIN_SAMPLES_DAYS = 30
    owner = make_user("owner")
    webdata.make_sweep_run(owner, [1, 4], seed=1)
    staff = make_user("admin", is_staff=True)
    browser = Client()
    browser.force_login(staff)
    page = browser.get("/staff/storage/")
    assert page.status_code == 200
    usage = page.context["usage"]
    assert usage["measurements_with_samples"] == 2 and usage["samples_and_telemetry_bytes"] > 0
    assert usage["files"]["samples"]["count"] >= 2 and usage["files"]["samples"]["bytes"] > 0
    assert usage["retention"] == {"samples": 30, "telemetry": 0, "logs": 0}
    assert any(t["table"] == "benchmarks_measurement" for t in usage["tables"])
    text = page.content.decode()
    assert 'id="objects"' in text and "benchmarks_measurement" in text
    assert 'href="/staff/storage/"' in text  # in the staff's navigation
    user = Client()
    user.force_login(owner)
    assert user.get("/staff/storage/").status_code == 302  # to the admin's sign-in
    assert Client().get("/staff/storage/").status_code == 302


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(300)
def test_the_daily_task_runs_in_the_real_worker(make_user, celery_worker, waiter):
    run = ended_days_ago(webdata.make_sweep_run(make_user("nightly"), [1], seed=1), 10)
    names = stored(run)
    assert names and all(exists(n) for n in names)
    celery_worker(extra_env={"SERVEBENCH_RETAIN_SAMPLES_DAYS": "3"})
    app.send_task("servebench.retention")
    waiter(
        lambda: Run.objects.filter(pk=run.pk, samples_expired_at__isnull=False).exists(),
        60,
        "the worker's retention pass",
    )
    assert not any(exists(n) for n in names)
