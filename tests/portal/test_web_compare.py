"""The compare page: a permalink with the selection and baseline in the URL, built on the
shared verdict (a comparability warning naming what differs, colour only for worse and
better), an explicit baseline selector, a message instead of an empty page, and the
finished comparison cached."""

from __future__ import annotations

import json
import re
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
    assert "the oldest of them is the reference run" in listing
    # The list sends the newest first; the oldest ticked run is the baseline.
    response = client.get(f"/compare/?runs={b.public_id}&runs={a.public_id}")
    assert response.status_code == 302
    assert response["Location"] == (
        f"/compare/?runs={b.public_id},{a.public_id}&reference={a.public_id}"
    )
    page = client.get(response["Location"])
    assert page.status_code == 200
    assert page.context["baseline_id"] == a.public_id
    html = page.content.decode()
    # The baseline is chosen explicitly, and its row and column come first.
    assert 'id="reference-select"' in html
    assert f'<option value="{a.public_id}" selected>' in html
    assert f'<option value="{b.public_id}">' in html
    runs_table = html[html.index('id="compare-runs"') :]
    assert runs_table.index(a.short_id) < runs_table.index(b.short_id)
    # Short ids, as the pages show them, resolve to the canonical permalink.
    short = client.get(f"/compare/?runs={a.short_id},{b.short_id}&reference={b.short_id}")
    # An older link's baseline= is the reference run, redirected to the canonical form.
    older = client.get(f"/compare/?runs={a.public_id},{b.public_id}&baseline={b.public_id}")
    assert older["Location"] == (
        f"/compare/?runs={a.public_id},{b.public_id}&reference={b.public_id}"
    )
    assert short["Location"] == (
        f"/compare/?runs={a.public_id},{b.public_id}&reference={b.public_id}"
    )


def test_one_run_or_none_gets_a_message_not_an_empty_page(make_user: Any) -> None:
    owner = make_user("alice")
    run = webdata.make_sweep_run(owner, [1, 4])
    client = signed_in(owner)
    none = client.get("/compare/")
    assert none.status_code == 200 and 'id="compare-empty"' in none.content.decode()
    assert "No runs chosen yet" in none.content.decode()
    one = client.get(f"/compare/?runs={run.public_id}")
    html = one.content.decode()
    assert one.status_code == 200 and 'id="compare-one"' in html
    assert "needs at least one more" in html and run.get_absolute_url() in html
    assert 'id="figures-data"' not in html


def test_the_page_overlays_every_run_and_tables_each_metric(make_user: Any) -> None:
    owner = make_user("alice")
    runs = [webdata.make_sweep_run(owner, [1, 2, 4, 8], seed=i) for i in range(3)]
    ids = ",".join(r.public_id for r in runs)
    page = signed_in(owner).get(f"/compare/?runs={ids}&reference={runs[1].public_id}")
    assert page.status_code == 200
    figures = {f["id"]: f["figure"] for f in page.context["figures"]}
    assert set(figures) == {
        "concurrency-output", "concurrency-ttft", "concurrency-tpot", "concurrency-pareto",
        "configurations-front",
    }  # fmt: skip
    front = figures["configurations-front"]["data"]
    assert [t["name"] for t in front][-1] == "Pareto front" and len(front) == 3 + 1
    assert all(len(t["x"]) == 4 for t in front[:3])  # every load point of every run
    html_ranked = page.content.decode()
    assert 'id="ranking-table"' in html_ranked and html_ranked.count("#3</th>") == 1
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
        page = client.get(f"/compare/?runs={ids}&reference={runs[0].public_id}")
    payload = json.dumps(page.context["figures"], separators=(",", ":"))
    assert len(payload.encode()) < 200_000, len(payload)
    # Session and user, the runs and their series' stamp (the cache key), then compare's
    # (test_compare), then 4 to look for it in Postgres and keep it there (a savepoint).
    assert len(ctx.captured_queries) <= 14
    # All finished: the second request is served from the cache.
    with CaptureQueriesContext(connection) as ctx:
        again = client.get(f"/compare/?runs={ids}&reference={runs[0].public_id}")
    assert len(ctx.captured_queries) <= 4
    assert again.content.count(b'data-metric="') == page.content.count(b'data-metric="')


@pytest.mark.parametrize("who", ["other", "anon"])
def test_a_private_run_in_the_selection_is_a_404(make_user: Any, who: str) -> None:
    owner = make_user("alice")
    a = webdata.make_sweep_run(owner, [1], public=True)
    b = webdata.make_sweep_run(owner, [1])
    client = signed_in(make_user("mallory")) if who == "other" else Client()
    url = f"/compare/?runs={a.public_id},{b.public_id}&reference={a.public_id}"
    assert client.get(url).status_code == 404
    Run.objects.filter(pk=b.pk).update(is_public=True)
    assert client.get(url).status_code == 200


def test_a_bad_selection_says_what_is_wrong(make_user: Any) -> None:
    page = signed_in(make_user()).get("/compare/?runs=not-an-id!")
    assert page.status_code == 400 and "is not a run id" in page.content.decode()


def test_runs_that_measured_different_things_are_flagged_and_not_judged(
    make_user: Any,
) -> None:
    owner = make_user("alice")
    base = webdata.make_sweep_run(owner, [1, 4], seed=1)
    spec = webdata.sweep_spec([1, 4])
    spec["workload"]["input_len"] = 256
    other = webdata.make_sweep_run(owner, [1, 4], seed=2, spec=spec)
    url = f"/compare/?runs={base.public_id},{other.public_id}&reference={base.public_id}"
    html = signed_in(owner).get(url).content.decode()
    warning = html[html.index('id="not-comparable"') : html.index('id="reference-form"')]
    assert "Not comparable" in warning and "workload.input_len: 128 → 256" in warning
    assert 'data-verdict="not comparable"' in html
    assert 'class="num worse' not in html and 'class="num better' not in html


def test_only_what_the_engine_calls_worse_or_better_is_coloured(make_user: Any) -> None:
    owner = make_user("alice")
    base = webdata.make_sweep_run(owner, [1, 4, 16], repeats=2, seed=1, peak=2000.0)
    slower = webdata.make_sweep_run(owner, [1, 4, 16], repeats=2, seed=2, peak=1000.0)
    url = f"/compare/?runs={base.public_id},{slower.public_id}&reference={base.public_id}"
    html = signed_in(owner).get(url).content.decode()
    cells = re.findall(r'<td class="num([^"]*)" data-verdict="([^"]*)"', html)
    assert cells, "no judged cell"
    for classes, verdict in cells:
        coloured = {"worse", "better"} & set(classes.split())
        assert coloured == ({verdict} & {"worse", "better"}), (classes, verdict)
    assert any(v == "worse" for _, v in cells)  # half the throughput, beyond the noise
    assert '<span class="verdict">worse</span>' in html  # said in words, not colour alone


def test_overlaid_charts_have_legends_naming_each_run(make_user: Any) -> None:
    owner = make_user("alice")
    runs = [webdata.make_sweep_run(owner, [1, 4], seed=i, name=f"run {i}") for i in range(2)]
    ids = ",".join(r.public_id for r in runs)
    page = signed_in(owner).get(f"/compare/?runs={ids}&reference={runs[0].public_id}")
    for f in page.context["figures"]:
        assert f["figure"]["layout"]["showlegend"] is True, f["id"]
        shown = [t["name"] for t in f["figure"]["data"] if t.get("showlegend", True)]
        assert shown[0] == f"run 0 ({runs[0].short_id}, reference)", shown
        assert shown[1] == f"run 1 ({runs[1].short_id})", shown
        symbols = {t["marker"]["symbol"] for t in f["figure"]["data"] if "marker" in t}
        assert len(symbols) >= 2, f["id"]  # one marker per run, beside its colour


def test_run_names_with_html_are_escaped_in_chart_specs(make_user: Any) -> None:
    owner = make_user("alice")
    evil = [
        webdata.make_sweep_run(owner, [1, 4], name=f"<b onmouseover=x>{i}</b>", seed=i)
        for i in range(2)
    ]
    ids = ",".join(r.public_id for r in evil)
    page = signed_in(owner).get(f"/compare/?runs={ids}&reference={evil[0].public_id}")
    names = [t["name"] for f in page.context["figures"] for t in f["figure"]["data"]]
    assert names and all("<b" not in n for n in names)
    assert any(n.startswith("&lt;b onmouseover=x&gt;0&lt;/b&gt;") for n in names)
    assert "<b onmouseover=x>" not in page.content.decode()
