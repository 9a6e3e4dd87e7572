"""The history page and API: one comparable series over time, versions labelled, a fixed
number of queries whatever its length."""

from __future__ import annotations

import re
from typing import Any

import pytest
import webdata
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from portal.benchmarks import history as hist
from portal.benchmarks.models import Run

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def series(make_user: Any) -> list[Run]:
    owner = make_user("alice")
    versions = ["0.30.0", "0.30.0", "0.31.0", "0.32.0"]
    return [
        webdata.make_sweep_run(
            owner, [1, 4, 16], name=f"nightly {i}", env=webdata.snapshot(vllm=v), seed=i
        )
        for i, v in enumerate(versions)
    ]


def test_the_history_lists_each_run_with_the_versions_that_changed(series: list[Run]) -> None:
    fingerprint = series[0].fingerprint
    assert all(r.fingerprint == fingerprint for r in series)
    page = signed_in(series[0].owner).get(f"/history/{fingerprint}/")
    assert page.status_code == 200
    history = page.context["history"]
    assert history.point_key == "concurrency:max_concurrency=16"  # the top concurrency
    assert [p.public_id for p in history.points] == [r.public_id for r in series]
    assert [p.changes for p in history.points] == [
        [],
        [],
        ["vLLM 0.30.0 → 0.31.0"],
        ["vLLM 0.31.0 → 0.32.0"],
    ]
    figure = page.context["figures"][0]["figure"]
    assert figure["data"][0]["customdata"] == [r.get_absolute_url() for r in series]
    assert len(figure["layout"]["annotations"]) == 2
    html = page.content.decode()
    for run in series:
        assert f'href="{run.get_absolute_url()}"' in html


def test_the_history_follows_the_metric_and_point_in_the_url(series: list[Run]) -> None:
    url = (
        f"/history/{series[0].fingerprint}/?metric=p99_ttft_ms&point=concurrency:max_concurrency=1"
    )
    history = signed_in(series[0].owner).get(url).context["history"]
    assert history.metric.key == "p99_ttft_ms"
    assert history.point_key == "concurrency:max_concurrency=1"
    bad = signed_in(series[0].owner).get(f"/history/{series[0].fingerprint}/?metric=bogus")
    assert bad.status_code == 400 and "unknown metric" in bad.content.decode()


def test_the_history_runs_the_same_queries_for_4_or_40_runs(
    series: list[Run], make_user: Any
) -> None:
    client = signed_in(series[0].owner)
    url = f"/history/{series[0].fingerprint}/"
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    for i in range(36):
        webdata.make_sweep_run(series[0].owner, [1, 4, 16], name=f"more {i}", seed=10 + i)
    with CaptureQueriesContext(connection) as many:
        page = client.get(url)
    assert len(page.context["history"].points) == 40
    # 6 build it, 4 look for it in Postgres and keep it there (the insert in a savepoint)
    assert len(few.captured_queries) == len(many.captured_queries) <= 10


def test_other_peoples_private_runs_stay_out_of_the_history(
    series: list[Run], make_user: Any
) -> None:
    fingerprint = series[0].fingerprint
    assert signed_in(make_user("mallory")).get(f"/history/{fingerprint}/").status_code == 404
    assert Client().get(f"/history/{fingerprint}/").status_code == 404
    Run.objects.filter(pk=series[1].pk).update(is_public=True)
    history = Client().get(f"/history/{fingerprint}/").context["history"]
    assert [p.public_id for p in history.points] == [series[1].public_id]


def test_the_history_api_answers_the_same_series(series: list[Run], personas: Any) -> None:
    Run.objects.filter(pk__in=[r.pk for r in series]).update(owner=personas["owner"].user)
    fingerprint = series[0].fingerprint
    url = f"/api/v1/history/?fingerprint={fingerprint}&metric=output_throughput"
    body = personas["owner"].client.get(url).json()
    assert [p["run"] for p in body["points"]] == [r.public_id for r in series]
    assert body["points"][2]["changes"] == ["vLLM 0.30.0 → 0.31.0"]
    assert body["metric"]["key"] == "output_throughput"
    for who in ("other", "anon"):
        response = personas[who].client.get(url)
        assert response.status_code == 404, who
    bad = personas["owner"].client.get(f"/api/v1/history/?fingerprint={fingerprint}&metric=x")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "metric"


def test_repeats_of_a_sweep_are_all_in_the_history(make_user: Any) -> None:
    """``queries.current`` drops only an SLA search's superseded load, never a sweep's
    own repeat 0 (repeat 1 beside it is a repeat, not a confirmation)."""
    run = webdata.make_sweep_run(make_user("rita"), [1, 4], repeats=2, seed=3)
    history = hist.history(run.owner, run.fingerprint, point="concurrency:max_concurrency=4")
    (point,) = history.points
    stored = run.measurements.filter(point_key="concurrency:max_concurrency=4", backend="vllm")
    values = [m.output_throughput for m in stored]
    assert point.repeats == 2 and point.value == pytest.approx(sum(values) / 2)


def test_a_long_history_is_cut_to_the_newest(series: list[Run]) -> None:
    history = hist.history(series[0].owner, series[0].fingerprint, limit=3)
    assert history.truncated and [p.public_id for p in history.points] == [
        r.public_id for r in series[1:]
    ]


def test_a_finished_series_is_rendered_once_and_a_new_run_shows(series: list[Run]) -> None:
    client = signed_in(series[0].owner)
    url = f"/history/{series[0].fingerprint}/"
    with CaptureQueriesContext(connection) as built:
        first = client.get(url)
    with CaptureQueriesContext(connection) as cached:
        again = client.get(url)
    assert len(cached.captured_queries) < len(built.captured_queries)
    assert again.content.count(b"<tr><td data-sort=") == first.content.count(b"<tr><td data-sort=")
    webdata.make_sweep_run(series[0].owner, [1, 4, 16], name="tonight", seed=99)
    fresh = client.get(url)
    assert b"tonight" in fresh.content and len(fresh.context["history"].points) == 5


def _index_columns(name: str) -> set[str]:
    """The columns an index holds, its keys and its ``include``, from PostgreSQL's catalog."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
            " WHERE c.relname = %s",
            [name],
        )
        return {row[0] for row in cursor.fetchall()}


def test_the_series_stamps_and_noise_series_read_only_the_series_index(
    series: list[Run],
) -> None:
    """The queries over a series' runs that every history and compare page pays (the
    stamps its kept page is keyed by) and a compare's noise series read only columns
    the (fingerprint, created_at) index holds, so each is an index-only scan of it. When
    one reads a column the index lacks, the planner ANDs a bitmap of every run the reader
    may see (every public run: growing with the table, 3.5 ms at 100,000 runs on each
    warm history page) with the fingerprint's: add the column to the index's ``include``."""
    owner = series[0].owner
    client = signed_in(owner)
    ids = ",".join(r.public_id for r in series)
    pages = [
        f"/history/{series[0].fingerprint}/",
        f"/compare/?runs={ids}&reference={series[0].public_id}",
    ]
    found = []
    for url in pages:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        found += [
            q["sql"]
            for q in queries.captured_queries
            if '"benchmarks_run"."fingerprint" =' in q["sql"]
            # aggregates (the stamps) and id lists (the noise series), not a whole run
            # (the history's newest run, one row read by its id)
            and (q["sql"].startswith("SELECT COUNT(") or 'AS "pk"' in q["sql"])
        ]
    # the history's stamp, the compare's stamp, and the compare's noise series
    assert len(found) == 3, found
    held = _index_columns("run_fingerprint_visible")
    for sql in found:
        read = set(re.findall(r'"benchmarks_run"\."(\w+)"', sql))
        assert read and read <= held, (read - held, sql)
