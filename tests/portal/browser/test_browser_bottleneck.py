"""What limited each point, in a real Chromium: the summary table's "Limited by" column and
the list under it, one line per point with its evidence (issue 26, item 4)."""

from __future__ import annotations

from typing import Any

import limitsdata
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_run_page_lists_what_limited_each_point(
    page: Any, make_run: Any, spec_dict: Any
) -> None:
    run = limitsdata.limited_run(make_run, spec_dict)  # public: no sign-in
    page.goto(run.get_absolute_url())
    page.page.wait_for_selector("#limits-list")
    items = page.page.locator("#limits-list li")
    assert items.count() == len(limitsdata.EXPECTED)
    causes = [items.nth(i).get_attribute("data-cause") for i in range(items.count())]
    assert sorted(causes) == sorted(limitsdata.EXPECTED.values())
    assert items.nth(0).is_visible()
    headers = page.page.locator("#summary-table thead th").all_inner_texts()
    assert "Limited by" in headers
    cells = page.page.locator("#summary-table td.limit").all_inner_texts()
    assert "scheduler-queue" in cells and "kv-capacity" in cells
    page.page.locator("#limits").scroll_into_view_if_needed()
    page.shot("run-limits")
    assert page.console_errors == []
