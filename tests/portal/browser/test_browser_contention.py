"""The run page of a run measured under CPU contention, in headless Chromium: the warning
is visible above the charts, its reasons open on click, and the HF and speedup cards say
why their numbers are not to be trusted."""

from __future__ import annotations

from typing import Any

import pytest
from conditionsdata import REASON, run_with

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_contended_baseline_is_flagged_where_people_look(page: Any, make_user: Any) -> None:
    user = make_user("gina")
    split = "server 0-6, client 7 (split: 7 physical cores to the server, 1 to the client)"
    run = run_with(user, hf_contended=True, core_split=split)
    page.sign_in(user.username, "pw-gina")
    page.goto(run.get_absolute_url())
    warning = page.page.locator("#contention-warning")
    assert warning.is_visible()
    assert "Measured under CPU contention" in warning.inner_text()
    # The warning's reasons are one click away (the "limited by" list names the same
    # contention as that point's evidence, outside the warning).
    assert not warning.get_by_text(REASON).is_visible()
    warning.locator("summary").click()
    assert warning.get_by_text(REASON).is_visible()
    assert "measured under CPU contention" in page.page.locator("#hf-stat").inner_text()
    assert "not trustworthy" in page.page.locator("#speedup-stat").inner_text()
    # Which cores the server and the load generator had, right under the warning.
    cores = page.page.locator("#core-split")
    assert cores.is_visible() and cores.inner_text() == f"Cores: {split}."
    page.assert_fits()
    page.shot("run-contended")
    page.page.set_viewport_size({"width": 390, "height": 844})
    box = cores.bounding_box()  # the line wraps inside a phone's width
    assert cores.is_visible() and box is not None and box["x"] + box["width"] <= 390
    page.shot("run-contended-390")
    assert page.console_errors == []
