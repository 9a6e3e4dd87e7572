"""Every page at a desktop width (1280 px) and a phone's (390 px), in headless Chromium:
the page is never wider than the window (tables scroll inside their box), the navigation
stays reachable, no console error (the Content-Security-Policy forbids inline script and
eval: plotly's basic bundle runs under it), charts draw with their titles as HTML above
them, and a screenshot of each lands in artifacts/screenshots/ to look at."""

from __future__ import annotations

from typing import Any

import pytest
import webdata

from portal.benchmarks.models import Measurement, Run, RunStatus

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTHS = {"desktop": 1280, "phone": 390}

# Layout facts of the page as drawn: how wide the document is, against the window; and
# every visible element that sticks out past the window's right edge (not inside a
# scrolling box), named, so a failure says what to fix.
LAYOUT = """
() => {
  const width = document.documentElement.clientWidth;
  const inScroller = (el) => {
    for (let p = el.parentElement; p; p = p.parentElement) {
      const style = getComputedStyle(p);
      if (['auto', 'scroll', 'hidden'].includes(style.overflowX)) return true;
    }
    return false;
  };
  const out = [];
  document.querySelectorAll('body *').forEach((el) => {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || inScroller(el)) return;
    if (r.right > width + 1) {
      const what = el.id ? '#' + el.id : el.tagName.toLowerCase() + '.' + el.className;
      out.push(what + ' right=' + Math.round(r.right));
    }
  });
  return {
    scrollWidth: document.documentElement.scrollWidth,
    width: width,
    overflowing: out.slice(0, 8),
  };
}
"""

NAV_VISIBLE = """
() => Array.from(document.querySelectorAll('header.top nav a')).map((a) => {
  const r = a.getBoundingClientRect();
  const inside = r.right <= document.documentElement.clientWidth + 1;
  return {text: a.textContent.trim(), visible: r.width > 0 && inside};
})
"""

CHARTS_DRAWN = (
    "Array.from(document.querySelectorAll('[data-figure-id]'))"
    ".every(e => e.data && e.querySelector('.main-svg'))"
)


def check(page: Any, name: str, path: str, *, charts: bool = False, status: int = 200) -> None:
    """Open ``path`` at each width: no page-level horizontal overflow, the navigation's
    links all on screen, charts drawn, no console error; a screenshot per width."""
    for label, width in WIDTHS.items():
        page.page.set_viewport_size({"width": width, "height": 900})
        response = page.goto(path)
        assert response.status == status, (path, response.status)
        page.page.wait_for_load_state("load")
        if charts:
            try:
                page.wait_for(CHARTS_DRAWN)
            except AssertionError as exc:
                message = f"{name} {label}: {exc}; console: {page.console_errors}"
                raise AssertionError(message) from exc
        facts = page.page.evaluate(LAYOUT)
        page.shot(f"{name}-{label}")
        assert facts["scrollWidth"] <= facts["width"], (name, label, facts)
        assert facts["overflowing"] == [], (name, label, facts)
        nav = page.page.evaluate(NAV_VISIBLE)
        assert nav and all(link["visible"] for link in nav), (name, label, nav)
        if status >= 400:
            page.console_errors.clear()  # the browser logs the error status itself
        assert page.console_errors == [], (name, label, page.console_errors)


def test_every_page_fits_a_phone_and_a_desktop(page: Any, make_user: Any) -> None:
    user = make_user("nina")
    runs = [
        webdata.make_sweep_run(
            user,
            [1, 2, 4, 8, 16, 32, 64],
            repeats=2,
            slo={"ttft_ms": 600},
            prompt_lengths=[128, 512, 1024, 2048],
            output_lengths=[32, 128, 512],
            preempt_from=32,
            name="Llama-3.1-8B-Instruct on one H100: the seed experiment with a long name",
            env=webdata.snapshot(vllm=version),
            seed=i,
            peak=2000 + 150 * i,
        )
        for i, version in enumerate(["0.31.0", "0.32.0", "0.32.0"])
    ]
    run = runs[0]
    cpu = webdata.make_sweep_run(
        user,
        [1, 2, 4],
        name="tiny demo on the CPU",
        env=webdata.snapshot(gpu="CPU"),
        spec=webdata.sweep_spec([1, 2, 4], name="tiny demo on the CPU"),
    )
    Measurement.objects.filter(run=cpu).update(kv_cache_usage_peak=0.0, gpu_memory_peak_bytes=None)
    live = webdata.make_sweep_run(user, [1, 4], name="still running", finish=False)
    Run.objects.filter(pk=live.pk).update(status=RunStatus.RUNNING, progress_total=9)

    # Anonymous: home and sign-in.
    check(page, "home", "/")
    check(page, "login", "/login/")
    page.sign_in(user.username, "pw-nina")
    check(page, "runs", "/runs/")
    check(page, "run-new", "/runs/new/")
    check(page, "tokens", "/tokens/")
    check(page, "run", run.get_absolute_url(), charts=True)
    check(page, "run-cpu", cpu.get_absolute_url(), charts=True)
    check(page, "run-live", live.get_absolute_url())
    baselines = webdata.make_baselines_run(user)  # every HF baseline, the speedup labels
    check(page, "run-baselines", baselines.get_absolute_url(), charts=True)
    ids = ",".join(r.public_id for r in runs)
    check(page, "compare", f"/compare/?runs={ids}&reference={runs[0].public_id}", charts=True)
    check(page, "compare-one", f"/compare/?runs={run.public_id}")
    check(page, "compare-none", "/compare/")
    check(page, "history", f"/history/{run.fingerprint}/", charts=True)
    check(page, "not-found", "/runs/nosuchrun0000000000/", status=404)


def test_the_run_page_reads_well_at_both_widths(page: Any, make_user: Any) -> None:
    user = make_user("omar")
    run = webdata.make_sweep_run(
        user, [1, 2, 4, 8, 16, 32, 64], slo={"ttft_ms": 600}, preempt_from=32, name="readable"
    )
    page.sign_in(user.username, "pw-omar")
    for width in WIDTHS.values():
        page.page.set_viewport_size({"width": width, "height": 900})
        page.goto(run.get_absolute_url())
        page.wait_for(CHARTS_DRAWN)
        # Titles are the page's HTML, above the chart: plotly's toolbar cannot cover them.
        overlap = page.page.evaluate(
            """() => Array.from(document.querySelectorAll('.chart-panel')).map((panel) => {
                 const title = panel.querySelector('figcaption').getBoundingClientRect();
                 const plot = panel.querySelector('.chart').getBoundingClientRect();
                 return title.bottom <= plot.top + 1;
               })"""
        )
        assert overlap and all(overlap)
        assert (
            page.page.evaluate("document.querySelectorAll('.chart .gtitle').length") == 0
        )  # no plotly title drawn inside the chart
        # The budget box starts from the spec's SLO, with its answer.
        assert page.page.input_value("#budget-ms") == "600"
        assert "tok/s at c=" in page.page.locator("#budget-result").inner_text()
        # The summary: key columns shown, the rest one click away.
        extra = "#summary-table th.extra"
        assert page.page.locator(extra).first.is_visible() is False
        page.page.click("label[for=all-columns]")
        assert page.page.locator(extra).first.is_visible() is True
        page.page.click("label[for=all-columns]")
        headers = page.page.locator("#summary-table thead th").all_inner_texts()
        assert "Output tok/s" in headers and not any("tok/s tok/s" in h for h in headers)
    assert page.console_errors == []
