"""Judging a change in headless Chromium (issue 23): a compare of a contended pair says so
at the top, with what changed; labels show on the run page (where its owner adds and
removes them), the runs list and the history; at 1280 and 390 px."""

from __future__ import annotations

from typing import Any

import pytest
from conditionsdata import run_with

from portal.benchmarks import baselines

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)


def test_a_contended_pair_says_so_above_the_verdicts(page: Any, make_user: Any) -> None:
    user = make_user("gina")
    clean = run_with(user, hf_contended=False)
    contended = run_with(user, hf_contended=False, vllm_contended_at=4)
    page.sign_in(user.username, "pw-gina")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto(
            f"/compare/?runs={clean.public_id},{contended.public_id}&reference={clean.public_id}"
        )
        banner = page.page.locator("#contended")
        assert banner.is_visible()
        text = banner.inner_text()
        assert "Measured under CPU contention" in text and "concurrency:max_concurrency=4" in text
        # It comes before the verdicts, and the change judged is said too (none: a re-run).
        box = banner.bounding_box()
        runs = page.page.locator("#compare-runs").bounding_box()
        assert box is not None and runs is not None and box["y"] < runs["y"]
        assert "nothing in the configuration" in page.page.locator("#what-changed").inner_text()
        page.assert_fits()
        page.shot(f"compare-contended-{width}")


def test_labels_show_on_three_pages_and_the_owner_sets_them(page: Any, make_user: Any) -> None:
    user = make_user("hana")
    first = run_with(user, hf_contended=False)
    second = run_with(user, hf_contended=False)
    baselines.mark(first, user, "main")
    page.sign_in(user.username, "pw-hana")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto(second.get_absolute_url())
        page.page.fill("#label-form input[name=label]", f"nightly-{width}")
        page.page.click("#add-label")
        page.page.wait_for_load_state()
        labels = page.page.locator("#labels")
        assert f"nightly-{width}" in labels.inner_text()
        page.assert_fits()
        page.shot(f"run-labels-{width}")
        page.goto("/runs/")
        table = page.page.locator("table").first.inner_text()
        assert "main" in table and f"nightly-{width}" in table
        page.assert_fits()
        page.goto(f"/history/{first.fingerprint}/")
        history = page.page.locator("#history-table").inner_text()
        assert "main" in history and f"nightly-{width}" in history
        page.assert_fits()
        page.shot(f"history-labels-{width}")
    # The owner removes one on the run page.
    page.goto(second.get_absolute_url())
    page.page.click("#labels button[name=remove][value='nightly-390']")
    page.page.wait_for_load_state()
    assert "nightly-390" not in page.page.locator("#labels").inner_text()
    assert sorted(baselines.labels_of([second.pk])[second.pk]) == ["nightly-1280"]
