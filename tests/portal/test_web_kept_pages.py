"""Finished pages are kept in Postgres (``portal.web.pagecache``): a compare, a history,
their API answers and a run's page are computed once and read back when the pages cache
has forgotten them; a run's end builds the compare its page links to. Real services,
real Postgres; the pages cache is this process's memory, emptied to play "forgotten"."""

from __future__ import annotations

from typing import Any

import webdata
from django.core.cache import caches
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.web import warm
from portal.web.models import StoredPage


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def get(client: Client, url: str) -> tuple[Any, str]:
    """The response, and every SQL statement it ran."""
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response, " ".join(q["sql"] for q in ctx.captured_queries)


def test_compare_and_history_the_cache_forgot_are_read_back_from_postgres(
    make_user: Any,
) -> None:
    owner = make_user("alice")
    series = [webdata.make_sweep_run(owner, [1, 4, 16], seed=i) for i in range(3)]
    ids = ",".join(r.public_id for r in series)
    fingerprint = series[0].fingerprint
    query = "metric=output_throughput&point=concurrency:max_concurrency=16&backend=vllm"
    urls = {
        "compare": f"/compare/?runs={ids}&reference={series[0].public_id}",
        "compare-api": f"/api/v1/compare/?runs={ids}&reference={series[0].public_id}",
        "history": f"/history/{fingerprint}/?{query}",
        "history-api": f"/api/v1/history/?fingerprint={fingerprint}&{query}",
    }
    client = signed_in(owner)
    built = {}
    for kind, url in urls.items():
        response, sql = get(client, url)
        assert "benchmarks_measurement" in sql, kind  # computed from the measurements
        built[kind] = response
    subjects = set(StoredPage.objects.values_list("subject", flat=True))
    assert len(subjects) == 4
    caches["pages"].clear()
    for kind, url in urls.items():
        again, sql = get(client, url)
        assert "benchmarks_measurement" not in sql, kind  # read back, not computed
        if kind.endswith("-api"):
            assert again.json() == built[kind].json()
        else:
            assert again.context["body"] == built[kind].context["body"]
            assert again.context.get("comparison") is None  # nothing computed here
    # A new run of the series changes what the verdicts' noise and the history read: the
    # pages are computed anew and replace their stale rows.
    webdata.make_sweep_run(owner, [1, 4, 16], seed=9)
    before = StoredPage.objects.count()
    caches["pages"].clear()
    for kind, url in urls.items():
        _, sql = get(client, url)
        assert "benchmarks_measurement" in sql, kind
    assert StoredPage.objects.count() == before
    assert set(StoredPage.objects.values_list("subject", flat=True)) == subjects


def test_a_reader_who_may_not_see_a_run_never_gets_its_kept_compare(make_user: Any) -> None:
    owner = make_user("alice")
    a = webdata.make_sweep_run(owner, [1, 4], public=True)
    b = webdata.make_sweep_run(owner, [1, 4], seed=2)
    url = f"/compare/?runs={a.public_id},{b.public_id}&reference={a.public_id}"
    get(signed_in(owner), url)
    caches["pages"].clear()
    assert Client().get(url).status_code == 404
    assert signed_in(make_user("mallory")).get(url).status_code == 404


def test_a_rerun_that_ends_builds_the_compare_its_page_links_to(
    make_user: Any, bearer_client: Any
) -> None:
    """The runner's "finished" report of a re-run builds the compare of the re-run's page
    ("Compare with the original") and of the original's ("... its re-runs"), so their
    first reader computes no verdict."""
    owner = make_user("alice")
    original = webdata.make_sweep_run(owner, [1, 4, 16])
    name = f"Re-run of {original.public_id}"
    rerun = webdata.make_sweep_run(owner, [1, 4, 16], seed=2, name=name, finish=False)
    token = issue_token(owner, kind=ApiToken.Kind.RUN, run=rerun).plaintext
    finished = {"type": "finished", "status": "succeeded", "errors": []}
    url = f"/api/v1/runner/runs/{rerun.public_id}/events"
    answer = bearer_client(token).post(url, finished, content_type="application/json")
    assert answer.json()["run_status"] == "succeeded"
    caches["pages"].clear()
    client = signed_in(owner)
    for page_run in (rerun, original):
        page, _ = get(client, page_run.get_absolute_url())
        assert page.context["compare_ids"] == (
            [rerun.public_id, original.public_id]
            if page_run is rerun
            else [original.public_id, rerun.public_id]
        )
        link = (
            f"/compare/?runs={','.join(page.context['compare_ids'])}"
            f"&reference={page.context['compare_baseline']}"
        )
        assert page.context["compare_baseline"] == original.public_id
        compared, sql = get(client, link)
        assert "benchmarks_measurement" not in sql and "benchmarks_run" in sql
        assert compared.context["count"] == 2
        assert compared.context["baseline_id"] == original.public_id
        StoredPage.objects.all().delete()  # what was kept is what the page computes
        caches["pages"].clear()
        computed, sql = get(client, link)
        assert "benchmarks_measurement" in sql
        assert computed.context["body"] == compared.context["body"]
        warm.ended(rerun.pk)  # as the report did, for the next page of the loop
        caches["pages"].clear()
