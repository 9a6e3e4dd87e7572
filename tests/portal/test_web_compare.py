"""The compare page: a permalink with the selection and baseline in the URL."""

from __future__ import annotations

import json
from typing import Any

import pytest
import webdata
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from portal.benchmarks.models import Run

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_form_post_from_the_list_lands_on_the_canonical_permalink(make_user: Any) -> None:
    owner = make_user("alice")
    a, b = (webdata.make_sweep_run(owner, [1, 4], seed=i) for i in range(2))
    client = signed_in(owner)
    listing = client.get("/runs/").content.decode()
    assert 'action="/compare/"' in listing and f'value="{a.public_id}"' in listing
    response = client.get(f"/compare/?runs={b.public_id}&runs={a.public_id}")
    assert response.status_code == 302
    assert response["Location"] == (
        f"/compare/?runs={b.public_id},{a.public_id}&baseline={b.public_id}"
    )
    page = client.get(response["Location"])
    assert page.status_code == 200
    assert page.context["comparison"].baseline_run == b


def test_the_page_overlays_every_run_and_tables_each_metric(make_user: Any) -> None:
    owner = make_user("alice")
    runs = [webdata.make_sweep_run(owner, [1, 2, 4, 8], seed=i) for i in range(3)]
    ids = ",".join(r.public_id for r in runs)
    page = signed_in(owner).get(f"/compare/?runs={ids}&baseline={runs[1].public_id}")
    assert page.status_code == 200
    figures = {f["id"]: f["figure"] for f in page.context["figures"]}
    assert set(figures) == {
        "concurrency-output", "concurrency-ttft", "concurrency-tpot", "concurrency-pareto",
    }  # fmt: skip
    output = figures["concurrency-output"]["data"]
    assert len(output) == 3 + 3  # one curve per run, one HF line per run
    assert all(len(t["x"]) == 4 for t in output[:3])
    html = page.content.decode()
    assert 'id="env-diff"' in html and 'id="env-same"' in html
    assert html.count('data-metric="output_throughput"') == 1 + 4  # HF + 4 points


def test_the_chart_data_of_8_runs_by_20_points_stays_under_200_kb(make_user: Any) -> None:
    owner = make_user("alice")
    values = [1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256]
    spec = webdata.sweep_spec(values)
    spec["model"]["max_model_len"] = 4096
    runs = [webdata.make_sweep_run(owner, values, seed=i, spec=spec) for i in range(8)]
    ids = ",".join(r.public_id for r in runs)
    client = signed_in(owner)
    with CaptureQueriesContext(connection) as ctx:
        page = client.get(f"/compare/?runs={ids}&baseline={runs[0].public_id}")
    payload = json.dumps(page.context["figures"], separators=(",", ":"))
    assert len(payload.encode()) < 200_000, len(payload)
    assert len(ctx.captured_queries) <= 8  # session and user, then compare's (test_compare)


@pytest.mark.parametrize("who", ["other", "anon"])
def test_a_private_run_in_the_selection_is_a_404(make_user: Any, who: str) -> None:
    owner = make_user("alice")
    a = webdata.make_sweep_run(owner, [1], public=True)
    b = webdata.make_sweep_run(owner, [1])
    client = signed_in(make_user("mallory")) if who == "other" else Client()
    url = f"/compare/?runs={a.public_id},{b.public_id}&baseline={a.public_id}"
    assert client.get(url).status_code == 404
    Run.objects.filter(pk=b.pk).update(is_public=True)
    assert client.get(url).status_code == 200


def test_a_bad_selection_says_what_is_wrong(make_user: Any) -> None:
    page = signed_in(make_user()).get("/compare/?runs=")
    assert page.status_code == 400 and "choose at least one run" in page.content.decode()


def test_run_names_with_html_are_escaped_in_chart_specs(make_user: Any) -> None:
    owner = make_user("alice")
    evil = [
        webdata.make_sweep_run(owner, [1, 4], name=f"<b onmouseover=x>{i}</b>", seed=i)
        for i in range(2)
    ]
    ids = ",".join(r.public_id for r in evil)
    page = signed_in(owner).get(f"/compare/?runs={ids}&baseline={evil[0].public_id}")
    names = [t["name"] for f in page.context["figures"] for t in f["figure"]["data"]]
    assert names and all("<b" not in n for n in names)
    assert any(n.startswith("&lt;b onmouseover=x&gt;0&lt;/b&gt;") for n in names)
    assert "<b onmouseover=x>" not in page.content.decode()
