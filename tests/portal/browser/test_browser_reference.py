"""The reader picks the reference (issue 29, item 4), in Chromium at 1280 and 390 px: the
run page's headline, the summary's Speedup column and the throughput chart's labels speak
of hf-sequential by default, and of the chosen HF baseline or vLLM configuration (then at
the same point) after a choice, which the URL keeps (reload, share, downloads)."""

from __future__ import annotations

from typing import Any

import pytest
import webdata

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = (1280, 390)


def _chart_note(page: Any) -> str:
    return page.page.inner_text("#chart-concurrency-output >> xpath=.. >> figcaption")


def test_the_reader_picks_the_reference_and_the_url_keeps_it(page: Any, make_user: Any) -> None:
    user = make_user("rhea")
    run = webdata.make_baselines_run(user, eager=True)
    page.sign_in(user.username, "pw-rhea")
    for width in WIDTHS:
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto(run.get_absolute_url())
        page.wait_for("document.querySelector('#chart-concurrency-output .main-svg')")
        options = page.page.eval_on_selector_all(
            "#reference option", "els => els.map(e => e.value)"
        )
        assert options == [
            "hf-sequential", "hf-static-cache", "hf-batched", "ts-cb", "vllm", "vllm-eager",
        ]  # fmt: skip
        assert page.page.input_value("#reference") == "hf-sequential"
        assert "vLLM speedup over hf-sequential" in page.page.inner_text("#speedup-stat")
        assert "times hf-sequential" in _chart_note(page)

        # An HF baseline: every label follows, and the URL says so.
        page.page.select_option("#reference", "hf-static-cache")
        page.page.wait_for_url("**reference=hf-static-cache")
        page.wait_for("document.querySelector('#chart-concurrency-output .main-svg')")
        assert "hf-static-cache output tok/s (HF baseline)" in page.page.inner_text("#hf-stat")
        assert "vLLM speedup over hf-static-cache" in page.page.inner_text("#speedup-stat")
        assert "\u00d7 hf-static-cache" in page.page.inner_text("#summary-table thead")
        assert "times hf-static-cache" in _chart_note(page)

        # A vLLM configuration: compared at the same point; the best point is another's.
        page.page.select_option("#reference", "vllm-eager")
        page.page.wait_for_url("**reference=vllm-eager")
        page.wait_for("document.querySelector('#chart-concurrency-output .main-svg')")
        speedup = page.page.inner_text("#speedup-stat")
        assert "speedup over vllm-eager at the same point" in speedup
        assert speedup.startswith("2.0\u00d7")  # vllm-eager measured half of vllm's everywhere
        assert "vllm-eager output tok/s (the reference, at" in page.page.inner_text("#hf-stat")
        assert "times vllm-eager at the same point" in _chart_note(page)
        labels = page.page.eval_on_selector_all(
            "#chart-concurrency-output .annotation-text", "els => els.map(e => e.textContent)"
        )
        assert "2.0x" in labels
        csv_link = page.page.get_attribute("#download-csv", "href")
        assert csv_link is not None and csv_link.endswith("?reference=vllm-eager")
        page.assert_fits()
        page.shot(f"run-reference-vllm-eager-{width}")

        # The URL keeps it: a reload (or a shared link) shows the same choice.
        page.page.reload()
        assert page.page.input_value("#reference") == "vllm-eager"
    # The downloads say which reference their speedups are over.
    response = page.page.request.get(page.base_url + csv_link)
    assert response.ok and ",vllm-eager," in response.text()
    # A name the run does not have falls back to the default, said as such.
    page.goto(run.get_absolute_url() + "?reference=nope")
    assert page.page.input_value("#reference") == "hf-sequential"
    assert page.console_errors == []
