"""Small things a newcomer trips over (issue 29, item 5), in Chromium at 1280 and 390 px:
a history of one run (or of runs seconds apart) reads in minutes, one slot per run; the
runs list shows each backend once; CSV standard deviations are empty for one repeat; the
API tokens page, the compare table and the telemetry charts fit a phone; past its count
cap the runs list pages on to the oldest run (item 7)."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
import webdata
from conditionsdata import run_with
from energydata import cpu_point, ingest, point_spec, with_gpus

from portal.benchmarks.models import Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)


def _ticks(page: Any, chart: str) -> list[str]:
    return page.page.eval_on_selector_all(
        f"#{chart} .xtick text", "els => els.map(e => e.textContent)"
    )


def test_a_history_reads_in_minutes_with_one_slot_per_run(page: Any, make_user: Any) -> None:
    user = make_user("hugo")
    first = run_with(user, hf_contended=False)
    page.sign_in(user.username, "pw-hugo")
    url = f"/history/{first.fingerprint}/"
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto(url)
        page.wait_for("document.querySelector('#chart-history .xtick text')")
        ticks = _ticks(page, "chart-history")
        assert ticks == [first.created_at.strftime("%Y-%m-%d %H:%M")]  # not 14:01:13.999
        page.assert_fits()
        page.shot(f"history-one-run-{width}")
    # Two more runs seconds later: three markers, three slots, none on another's x.
    run_with(user, hf_contended=False)
    run_with(user, hf_contended=False)
    page.goto(url)
    page.wait_for("document.querySelector('#chart-history .xtick text')")
    xs = page.page.evaluate("document.getElementById('chart-history').data[0].x")
    assert len(xs) == 3 and len(set(xs)) == 3
    page.shot("history-seconds-apart-1280")
    assert page.console_errors == []


def test_the_runs_list_shows_each_backend_once(page: Any, make_user: Any) -> None:
    user = make_user("lena")
    spec = webdata.sweep_spec([1, 4])
    spec["backends"] = [
        {"kind": "hf-sequential"},
        {"kind": "vllm"},
        {"kind": "vllm", "name": "vllm-eager", "enforce_eager": True},
    ]
    from portal.benchmarks import intake

    intake.create_run(user, spec, "named backends")
    page.sign_in(user.username, "pw-lena")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto("/runs/")
        cell = page.page.locator("table tbody tr").first.locator("td").nth(6).inner_text()
        assert cell == "hf-sequential, vllm, vllm-eager (vllm)"
        page.assert_fits()
        page.shot(f"runs-list-backends-{width}")


def test_the_runs_list_past_its_count_cap_pages_on_to_the_oldest_run(
    page: Any, make_user: Any, monkeypatch: Any
) -> None:
    """Past COUNT_CAP the list says "More than N", numbers its pages without a last one,
    and "older" reaches every run (issue 29, item 7: the exact count grew with the
    table)."""
    from portal.benchmarks import intake
    from portal.web.views import runs as run_views

    monkeypatch.setattr(run_views, "COUNT_CAP", 3)
    monkeypatch.setattr(run_views, "PAGE_SIZE", 2)
    user = make_user("omar")
    spec = webdata.sweep_spec([1])
    names = [f"run {i}" for i in range(5)]
    for name in names:
        intake.create_run(user, spec, name)
    page.sign_in(user.username, "pw-omar")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto("/runs/")
        assert page.page.inner_text("#run-count") == "More than 3 runs you can see."
        assert page.page.inner_text(".pager span") == "page 1"
        seen = []
        for number in (1, 2, 3):
            seen += page.page.locator("td.run-col a").all_inner_texts()
            assert page.page.inner_text(".pager span") == f"page {number}"
            page.assert_fits()
            page.shot(f"runs-list-past-the-cap-page-{number}-{width}")
            if number < 3:
                with page.page.expect_navigation():
                    page.page.click("text=older →")
        assert seen == names[::-1]
        assert page.page.locator("text=older →").count() == 0  # the oldest run: no next
    assert page.console_errors == []


def test_csv_std_columns_are_empty_for_one_repeat(page: Any, make_user: Any) -> None:
    user = make_user("cleo")
    run = run_with(user, hf_contended=False)  # measured once
    page.sign_in(user.username, "pw-cleo")
    response = page.page.request.get(page.base_url + f"/runs/{run.public_id}/points.csv")
    rows = list(csv.DictReader(io.StringIO(response.text())))
    assert rows and all(r["output_throughput"] for r in rows)
    assert {r["output_throughput_std"] for r in rows} == {""}
    # Whole numbers as integers: concurrency 4, not 4.0.
    assert {r["value"] for r in rows if r["sweep"] == "concurrency"} == {"1", "4", "16"}


def test_the_tokens_page_fits_a_phone(page: Any, make_user: Any) -> None:
    user = make_user("tomas")
    page.sign_in(user.username, "pw-tomas")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto("/tokens/")
        page.page.fill("#id_name", f"github-actions main {width}")
        page.page.click("main button[type=submit]")
        page.page.wait_for_load_state()
        assert page.page.locator("#token-value").is_visible()  # shown once, in full
        page.assert_fits()
        page.shot(f"tokens-new-{width}")
        revoke = page.page.locator("#token-table button").first.bounding_box()
        frame = page.page.locator("#token-table").locator("xpath=..").bounding_box()
        assert revoke is not None and frame is not None
        assert revoke["x"] + revoke["width"] <= frame["x"] + frame["width"], (revoke, frame)


def test_the_compare_table_shows_the_candidate_beside_the_metric(page: Any, make_user: Any) -> None:
    user = make_user("cora")
    reference = run_with(user, hf_contended=False)
    candidate = run_with(user, hf_contended=False)
    page.sign_in(user.username, "pw-cora")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto(
            f"/compare/?runs={reference.public_id},{candidate.public_id}"
            f"&reference={reference.public_id}"
        )
        table = page.page.locator("#compare-table")
        table.scroll_into_view_if_needed()
        heads = table.locator("thead th")
        # Every visible header column has a name, and the candidate's is on screen.
        texts = [heads.nth(i).inner_text().strip() for i in range(heads.count())]
        assert candidate.short_id in " ".join(texts)
        box = table.locator(f"thead th:has-text('{candidate.short_id}')").first.bounding_box()
        assert box is not None and box["x"] + box["width"] <= width + 1, (box, texts)
        page.assert_fits()
        table.locator("xpath=..").screenshot(
            path=str(page.shot(f"compare-{width}").with_name(f"compare-table-{width}.png"))
        )


def test_the_telemetry_toolbar_leaves_the_chart_title_alone(
    page: Any, make_run: Any, spec_dict: Any
) -> None:
    run = make_run(spec=point_spec(spec_dict), status="running")
    ingest(run, with_gpus(cpu_point()))
    Run.objects.filter(pk=run.pk).update(status="succeeded", is_public=True)
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto(run.get_absolute_url())
        page.wait_for("document.getElementById('telemetry-gpu').data")
        chart = page.page.locator("#telemetry-server")
        chart.scroll_into_view_if_needed()
        chart.hover()  # the toolbar shows on hover
        title = chart.locator(".gtitle").bounding_box()
        bar = chart.locator(".modebar").bounding_box()
        assert title is not None and bar is not None
        overlap_x = min(title["x"] + title["width"], bar["x"] + bar["width"]) - max(
            title["x"], bar["x"]
        )
        overlap_y = min(title["y"] + title["height"], bar["y"] + bar["height"]) - max(
            title["y"], bar["y"]
        )
        assert overlap_x <= 0 or overlap_y <= 0, (title, bar)
        page.assert_fits()
        page.page.locator("#telemetry-panel").screenshot(
            path=str(page.shot(f"telemetry-{width}").with_name(f"telemetry-panel-{width}.png"))
        )
