"""The run page's Ranking section in headless Chromium: a configuration search's run
(``rankingdata``: max_num_seqs 4, 1, 8 within p99 TTFT <= 300 ms) ranked best first with
the dropped configuration last and its reason, why the winner wins, its serve command one
click away, and the Pareto chart drawn, at a desktop's and a phone's width."""

from __future__ import annotations

from typing import Any

import pytest
from rankingdata import searched_run
from test_browser_layout import check

from portal.benchmarks.models import Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_run_page_ranks_the_configurations(
    page: Any, make_run: Any, spec_dict: Any, measurement: Any
):
    run = searched_run(make_run, spec_dict, measurement)
    Run.objects.filter(pk=run.pk).update(status="succeeded", is_public=True)

    page.goto(run.get_absolute_url())
    page.wait_for("document.getElementById('ranking-table')")
    rows = page.page.locator("#ranking-table tbody tr")
    assert rows.count() == 3
    first = [cell.strip() for cell in rows.nth(0).inner_text().split("\t")]
    assert first[:4] == ["1", "vllm-seqs8\nmax_num_seqs=8", "measured", "concurrency 8"]
    last = rows.nth(2).inner_text()
    assert "vllm-seqs1" in last and "dropped: missed p99 TTFT <= 300 ms at concurrency 4" in last
    assert page.page.inner_text("#ranking-why").startswith("vllm-seqs8 wins")
    # The winner's serve command: one click away.
    page.page.click("#ranking-serve summary")
    assert "--max-num-seqs 8" in page.page.inner_text("#cmd-winner-serve")
    page.wait_for("document.querySelector('#chart-ranking-front .main-svg')")
    page.page.locator("#ranking").scroll_into_view_if_needed()
    page.shot("run-ranking")
    assert page.console_errors == []
    check(page, "run-ranking", run.get_absolute_url(), charts=True)
