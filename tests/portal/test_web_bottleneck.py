"""What limited each point (issue 26, item 4) where people read it: the run page, the points
download, the API's measurements and ``servebench results``.

Data: ``limitsdata.limited_run``, the real tiny-model vLLM point measured on this project's
CPU machines stored through the real ingestion service with each cause's evidence.
"""

from __future__ import annotations

import json
from typing import Any

import limitsdata
import pytest
import webdata
from django.test import Client

from portal.benchmarks import documents
from servebench import render

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(make_run: Any, spec_dict: Any) -> Any:
    return limitsdata.limited_run(make_run, spec_dict)


EXPECTED = limitsdata.EXPECTED


def test_the_points_download_names_what_limited_each_point(run: Any) -> None:
    client = Client()
    points = json.loads(client.get(f"/runs/{run.public_id}/points.json").content)["points"]
    assert {p["point"]: p["limited_by"] for p in points} == EXPECTED
    by_point = {p["point"]: p["limited_by_evidence"] for p in points}
    assert "37 preemptions" in by_point["concurrency:max_concurrency=4"]
    assert (
        "ran at most 1 request at once while up to 15 waited"
        in (by_point["concurrency:max_concurrency=16"])
    )
    csv = client.get(f"/runs/{run.public_id}/points.csv").content.decode()
    assert "limited_by,limited_by_evidence" in csv.splitlines()[0]


def test_the_run_page_says_what_limited_each_point(run: Any) -> None:
    page = Client().get(run.get_absolute_url())
    html = page.content.decode()
    assert 'id="limits"' in html and "What limited each point" in html
    for row in page.context["summary_rows"]:
        assert row.point.bottleneck.cause == EXPECTED[row.point.point_key]
    assert 'data-cause="kv-capacity"' in html and "The KV cache ran out: 37 preemptions" in html
    assert "other processes used 1.58 CPUs of the 2 cores" in html


def test_the_api_gives_each_measurement_its_cause_and_evidence(run: Any) -> None:
    body = Client().get(f"/api/v1/runs/{run.public_id}/").json()
    limits = {m["point_key"]: m["limited_by"] for m in body["measurements"]}
    assert {k: v["cause"] for k, v in limits.items()} == EXPECTED
    # Who does not manage the run reads the failure's first line only.
    failed = limits["concurrency:max_concurrency=32"]["sentence"]
    assert "[Connection refused]" in failed and "Traceback" not in failed
    assert "0.96 CPU-seconds per second" in limits["concurrency:max_concurrency=2"]["sentence"]


def test_servebench_results_lists_what_limited_each_measurement(run: Any) -> None:
    text = render.results_table(documents.result_document(run))
    lines = text.split("limited by:\n", 1)[1].splitlines()
    assert lines[0].startswith("  vllm concurrency:max_concurrency=2 #0: client. ")
    assert any(
        "concurrency:max_concurrency=16 #0: scheduler-queue. The scheduler ran at most 1" in line
        for line in lines
    )


def test_the_configuration_ranking_says_what_limited_the_winner_and_the_runner_up(
    make_user: Any,
) -> None:
    owner = make_user("alice")
    fast = webdata.make_sweep_run(owner, [1, 2, 4, 8], peak=4000.0, name="fast")
    slow = [
        webdata.make_sweep_run(owner, [1, 2, 4, 8], seed=i, peak=1500.0, preempt_from=4)
        for i in (2, 3)
    ]
    ids = ",".join(r.public_id for r in (slow[0], fast, slow[1]))
    client = Client()
    client.force_login(owner)
    html = client.get(f"/compare/?runs={ids}&reference={slow[0].public_id}").content.decode()
    why = html.split('id="ranking-why">', 1)[1].split("</p>", 1)[0]
    assert why.startswith(f"Why: fast ({fast.short_id}) ranks first on Output tok/s")
    assert "what limited its load points: unknown at 4 of 4 points" in why
    assert ": kv-capacity at 2 of 4 points, unknown at 2 of 4 points." in why
    api = client.get(f"/api/v1/compare/?runs={ids}&reference={slow[0].public_id}").json()
    assert api["ranking_why"].startswith(f"fast ({fast.short_id}) ranks first")
    assert api["ranking_why"].endswith(
        "'s: kv-capacity at 2 of 4 points, unknown at 2 of 4 points."
    )


def test_on_a_known_gpu_decode_bound_points_cite_the_roofline_as_an_estimate(
    make_user: Any,
) -> None:
    run = webdata.make_sweep_run(make_user(), [1, 4, 16], running=0.75)
    client = Client()
    client.force_login(run.owner)
    page = client.get(run.get_absolute_url())
    fractions = {r.x: r.fraction for r in page.context["capacity"].roofline}
    rows = [r.point for r in page.context["summary_rows"] if r.point.axis == "max_concurrency"]
    assert [p.roofline_fraction for p in rows] == [fractions[p.x] for p in rows]
    bound = [p for p in rows if p.roofline_fraction >= 0.5]
    assert bound, fractions  # the recorded latencies on an H100's bandwidth
    for p in bound:
        limit = p.bottleneck
        assert limit.cause == "memory-bandwidth-decode (estimate)"
        assert f"about {p.roofline_fraction:.0%} of the memory-bandwidth roofline" in (
            limit.sentence
        )
    html = page.content.decode()
    assert "memory-bandwidth-decode (estimate)" in html and "(an estimate)" in html
