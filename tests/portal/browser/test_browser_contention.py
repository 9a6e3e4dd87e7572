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
    run = run_with(user, hf_contended=True)
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
    page.shot("run-contended")
    assert page.console_errors == []
