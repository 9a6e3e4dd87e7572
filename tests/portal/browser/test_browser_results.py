"""Results pages in headless Chromium: every chart drawn with its traces and points, the
summary table sorts, the budget tool answers, copy and PNG export work offline, compare
and history work from their URLs, private stays private, and names stay text."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import pytest
import webdata
from django.utils import timezone

from portal.benchmarks.models import Run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHART_SHAPES = """
() => {
  const figures = JSON.parse(document.getElementById('figures-data').textContent);
  return figures.map(f => {
    const el = document.getElementById('chart-' + f.id);
    return {
      id: f.id,
      expected: f.figure.data.map(t => (t.x || []).length),
      drawn: el && el.data ? el.data.map(t => (t.x || []).length) : null,
      svg: el ? el.querySelectorAll('.main-svg').length : 0,
    };
  });
}
"""


def user_with_password(make_user: Any, name: str) -> tuple[Any, str]:
    return make_user(name), "pw-" + name  # the factory's password


def offline(page: Any) -> list[str]:
    """Refuse every request that leaves the test server (no CDN, nothing external)."""
    blocked: list[str] = []
    host = urlparse(page.base_url).netloc

    def route(r: Any) -> None:
        if urlparse(r.request.url).netloc == host:
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    page.page.route("**/*", route)
    return blocked


def assert_charts_drawn(page: Any) -> list[dict[str, Any]]:
    page.wait_for("Array.from(document.querySelectorAll('[data-figure-id]')).every(e => e.data)")
    shapes = page.page.evaluate(CHART_SHAPES)
    for chart in shapes:
        assert chart["drawn"] == chart["expected"], chart
        assert chart["svg"] >= 1, chart
    return shapes


def test_the_run_page_draws_every_chart_of_every_sweep(page: Any, make_user: Any) -> None:
    user, password = user_with_password(make_user, "dora")
    run = webdata.make_sweep_run(
        user,
        [1, 2, 4, 8, 16, 32, 64],
        repeats=2,
        slo={"ttft_ms": 600},
        prompt_lengths=[128, 512, 1024, 2048],
        output_lengths=[32, 128, 512],
        preempt_from=32,
        name="Llama-3.1-8B on H100: seed sweep",
    )
    blocked = offline(page)
    page.sign_in(user.username, password)
    page.goto(run.get_absolute_url())
    shapes = {c["id"]: c for c in assert_charts_drawn(page)}
    # Concurrency: vLLM (7 points), the HF reference (2 ends), the preempting points (2).
    assert shapes["concurrency-output"]["drawn"] == [7, 2, 2]
    assert shapes["concurrency-pareto"]["drawn"][0] == 7
    assert shapes["concurrency-goodput"]["drawn"] == [7, 7, 7]
    assert shapes["concurrency-ttft"]["drawn"] == [7, 7, 7]  # p50, p90, p99
    assert shapes["prompt-length-output"]["drawn"][0] == 4
    assert shapes["output-length-e2el"]["drawn"][0] == 3
    assert len(shapes) == 9 + 8 + 8  # 8 per sweep with an SLO, Pareto for concurrency
    html = page.page.content()
    assert "the cache was driven past its efficient point" in html
    assert page.page.locator("#capacity #kv-per-token").inner_text().startswith("131,072 bytes")
    page.shot("run-results")
    page.docs_shot("screenshot-run")  # the README's picture, with SERVEBENCH_UPDATE_SCREENSHOT=1

    # The budget tool: the most throughput whose p99 TTFT fits.
    page.page.fill("#budget-ms", "100000")
    best_all = page.page.locator("#budget-result").inner_text()
    assert "tok/s at c=" in best_all, best_all
    page.page.fill("#budget-ms", "1")
    assert "no point within budget" in page.page.locator("#budget-result").inner_text()

    # The summary table sorts by a metric, both ways.
    header = page.page.locator("#summary-table th", has_text="Output tok/s")
    header.click()
    values = page.page.evaluate(
        "Array.from(document.querySelectorAll('#summary-table tbody tr')).map(r =>"
        " r.cells[Array.from(r.parentNode.parentNode.tHead.rows[0].cells).findIndex("
        "c => c.textContent.startsWith('Output tok/s'))].dataset.sort).filter(v => v)"
        ".map(Number)"
    )
    assert values == sorted(values) and len(values) == 1 + 7 + 4 + 3
    header.click()
    assert page.page.locator("#summary-table th[aria-sort=descending]").count() == 1

    # PNG export is plotly's own, in the browser: no network needed.
    png = page.page.evaluate(
        "Plotly.toImage(document.getElementById('chart-concurrency-output'),"
        " {format: 'png', width: 800, height: 500})"
    )
    assert png.startswith("data:image/png;base64,") and len(png) > 10_000
    # ... and the modebar's camera button downloads it.
    page.page.hover("#chart-concurrency-output")
    with page.page.expect_download() as download:
        page.page.click("#chart-concurrency-output .modebar-btn[data-title*='PNG']")
    assert download.value.suggested_filename == f"servebench-{run.short_id}-concurrency-output.png"
    assert blocked == []
    assert page.console_errors == []


def test_copy_buttons_copy_the_exact_command(page: Any, make_user: Any, settings: Any) -> None:
    # The image the runner reported goes under a Copy button only if the portal allows it.
    settings.SERVEBENCH_ALLOWED_RUNNER_IMAGES = ["ghcr.io/servebench/runner:*"]
    user, password = user_with_password(make_user, "erin")
    run = webdata.make_sweep_run(user, [1, 4])
    page.page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.sign_in(user.username, password)
    page.goto(run.get_absolute_url())
    button = page.page.locator("#reproduce button[data-copy=cmd-runner]")
    button.click()
    page.wait_for(
        "document.querySelector('#reproduce button[data-copy=cmd-runner]').textContent === 'Copied'"
    )
    copied = page.page.evaluate("navigator.clipboard.readText()")
    assert copied == f"python -m runners run servebench-{run.short_id}-spec.yaml --out result.json"
    assert "docker run" in page.page.locator("#cmd-container").inner_text()
    assert page.console_errors == []


def test_compare_from_the_list_then_from_its_permalink(page: Any, make_user: Any) -> None:
    user, password = user_with_password(make_user, "fred")
    runs = [
        webdata.make_sweep_run(
            user,
            [1, 2, 4, 8, 16, 32],
            name=f"vLLM {version}",
            env=webdata.snapshot(vllm=version),
            seed=i,
            peak=2000 + 300 * i,
        )
        for i, version in enumerate(["0.30.0", "0.31.0", "0.32.0"])
    ]
    page.sign_in(user.username, password)
    page.goto("/runs/")
    for run in (runs[0], runs[2]):
        page.page.check(f"input[name=runs][value='{run.public_id}']")
    page.page.click("#compare-selected")
    page.page.wait_for_url("**/compare/?runs=*")
    url = page.page.url
    # The list sends the ticked runs newest first; the oldest of them is the baseline.
    assert url.endswith(
        f"/compare/?runs={runs[2].public_id},{runs[0].public_id}&reference={runs[0].public_id}"
    ), url
    shapes = {c["id"]: c for c in assert_charts_drawn(page)}
    assert shapes["concurrency-output"]["drawn"] == [6, 6, 2, 2]  # 2 runs + 2 HF lines
    env = page.page.locator("#env-diff").inner_text()
    assert "vLLM" in env and "0.30.0" in env and "0.32.0" in env
    assert "PyTorch" not in env

    # The permalink, opened fresh, with three runs and the last one as baseline.
    ids = ",".join(r.public_id for r in runs)
    page.goto(f"/compare/?runs={ids}&reference={runs[2].public_id}")
    shapes = {c["id"]: c for c in assert_charts_drawn(page)}
    assert shapes["concurrency-output"]["drawn"] == [6, 6, 6, 2, 2, 2]
    assert page.page.locator("#compare-runs tr.baseline-row").inner_text().count("vLLM 0.32.0")
    # The reference's row comes first, and its column right after the metric's name.
    assert "reference" in page.page.locator("#compare-runs tbody tr").first.inner_text()
    first_column = page.page.locator("#compare-table thead th").nth(1)
    assert runs[2].short_id in first_column.inner_text()
    assert "reference" in first_column.inner_text()
    box = first_column.bounding_box()  # on screen at 1280 px, without scrolling sideways
    assert box is not None and box["x"] + box["width"] <= 1280, box
    legend = page.page.locator("#chart-concurrency-output .legend").text_content()
    assert runs[2].short_id in legend and runs[0].short_id in legend
    rows = "#compare-table tbody tr[data-metric]"
    assert page.page.locator(rows).count() > 6 * 10
    page.page.select_option("#metric-filter", "output_throughput")
    assert page.page.locator(f"{rows}:not([hidden])").count() == 1 + 6
    assert page.page.locator("#compare-table tbody:not([hidden])").count() == 1 + 6
    page.shot("compare")
    # Another baseline, from the selector: the page opens against it at once.
    page.page.select_option("#reference-select", runs[1].public_id)
    page.page.wait_for_url(f"**reference={runs[1].public_id}")
    assert page.page.locator("#compare-runs tr.baseline-row").inner_text().count("vLLM 0.31.0")
    assert page.console_errors == []


def test_history_charts_a_series_and_links_each_point(page: Any, make_user: Any) -> None:
    user, password = user_with_password(make_user, "gina")
    versions = ["0.30.0", "0.30.0", "0.31.0", "0.31.0", "0.32.0"]
    runs = [
        webdata.make_sweep_run(
            user, [1, 4, 16], name=f"nightly {i}", env=webdata.snapshot(vllm=v), seed=i
        )
        for i, v in enumerate(versions)
    ]
    assert len({r.fingerprint for r in runs}) == 1
    now = timezone.now()
    for i, run in enumerate(runs):  # nightly runs, a day apart
        Run.objects.filter(pk=run.pk).update(created_at=now - timedelta(days=len(runs) - i))
    page.sign_in(user.username, password)
    page.goto(runs[-1].get_absolute_url())
    page.page.click("#history-link")
    page.page.wait_for_url("**/history/**")
    shapes = assert_charts_drawn(page)
    assert shapes[0]["drawn"] == [5]
    notes = page.page.evaluate(
        "document.getElementById('chart-history').layout.annotations.map(a => a.text)"
    )
    assert notes == ["vLLM 0.30.0 → 0.31.0", "vLLM 0.31.0 → 0.32.0"]
    page.shot("history")
    # A click on the first marker opens its run.
    box = page.page.locator("#chart-history .scatterlayer .point").first.bounding_box()
    page.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.page.wait_for_url(f"**{runs[0].get_absolute_url()}")
    assert page.console_errors == []


def test_private_results_are_refused_and_public_ones_readable(page: Any, make_user: Any) -> None:
    owner = make_user("hank")
    run, other_run = (webdata.make_sweep_run(owner, [1, 4, 16], seed=i) for i in range(2))
    urls = [
        run.get_absolute_url(),
        f"/compare/?runs={run.public_id},{other_run.public_id}&reference={run.public_id}",
        f"/history/{run.fingerprint}/",
    ]
    for url in urls:  # anonymous
        assert page.goto(url).status == 404, url
    other, password = user_with_password(make_user, "ivan")
    page.sign_in(other.username, password)
    for url in urls:
        assert page.goto(url).status == 404, url
    page.console_errors.clear()  # the browser logs each 404 itself
    Run.objects.filter(pk__in=[run.pk, other_run.pk]).update(is_public=True)
    for url in urls:
        assert page.goto(url).status == 200, url
        assert_charts_drawn(page)
    # A reader who does not own it gets no share, re-run or log controls.
    page.goto(run.get_absolute_url())
    assert page.page.locator("#toggle-visibility, #rerun, #run-log").count() == 0
    assert page.console_errors == []


def test_names_with_html_stay_text_in_pages_and_charts(page: Any, make_user: Any) -> None:
    user, password = user_with_password(make_user, "judy")
    evil = '<img src=x onerror="window.__xss=1">'
    runs = [webdata.make_sweep_run(user, [1, 4, 16], name=evil + str(i), seed=i) for i in range(2)]
    page.sign_in(user.username, password)
    page.goto(f"/compare/?runs={runs[0].public_id},{runs[1].public_id}")
    assert_charts_drawn(page)
    # Plotly draws the run's name in the hover label: as text, not as an element.
    page.page.locator("#chart-concurrency-output").scroll_into_view_if_needed()
    page.page.evaluate(
        "Plotly.Fx.hover('chart-concurrency-output', [{curveNumber: 0, pointNumber: 0}])"
    )
    page.page.wait_for_selector("#chart-concurrency-output .hoverlayer .hovertext")
    hover = page.page.locator("#chart-concurrency-output .hoverlayer").text_content()
    assert "<img src=x onerror=" in hover, hover
    assert page.page.locator("#chart-concurrency-output img").count() == 0
    page.goto(f"/history/{runs[0].fingerprint}/")
    assert_charts_drawn(page)
    page.goto(runs[0].get_absolute_url())
    assert page.page.locator("h1").inner_text() == evil + "0"
    assert page.page.evaluate("window.__xss") is None
    assert page.console_errors == []


def test_the_owner_toggles_sharing_from_the_run_page(page: Any, make_user: Any) -> None:
    user, password = user_with_password(make_user, "kate")
    run = webdata.make_sweep_run(user, [1, 4])
    page.sign_in(user.username, password)
    page.goto(run.get_absolute_url())
    assert page.page.locator("#visibility").inner_text() == "private"
    page.page.click("#toggle-visibility")
    page.page.wait_for_load_state()
    assert page.page.locator("#visibility").inner_text() == "public"
    assert Run.objects.get(pk=run.pk).is_public
    og = page.page.locator("meta[property='og:description']").get_attribute("content")
    assert "output tok/s" in og
    page.page.click("#rerun")
    page.page.wait_for_url(lambda url: run.public_id not in url)
    assert page.page.locator("h1").inner_text() == f"Re-run of {run.name}"
    assert "no results yet" in page.page.locator("#rerun-verdict").inner_text()
    assert Run.objects.latest("created_at").name == f"Re-run of {run.public_id}"
    assert json.loads(json.dumps(Run.objects.latest("created_at").spec)) == run.spec
    page.shot("rerun-queued")
    assert page.console_errors == []


def test_the_owner_watches_the_runner_log_then_sees_why_it_failed(
    page: Any, make_user: Any, tmp_path: Any
) -> None:
    from portal.benchmarks import ingestion
    from runners import result as rr

    user, password = user_with_password(make_user, "liam")
    run = webdata.make_sweep_run(user, [1, 4], finish=False)
    log = tmp_path / "runner.log"
    log.write_text("servebench runner 0.1.0\nstarting vLLM server on port 8100\n")
    Run.objects.filter(pk=run.pk).update(
        executor="local", executor_handle={"workdir": str(tmp_path), "pid": 1, "pgid": 1}
    )
    page.sign_in(user.username, password)
    page.goto(run.get_absolute_url())
    assert "starting vLLM server" in page.page.locator("#run-log").inner_text()
    with log.open("a") as out:
        out.write("point concurrency:max_concurrency=16 ...\n")
    page.wait_for(
        "document.getElementById('run-log').textContent.includes('max_concurrency=16')",
        timeout=15_000,
    )
    with log.open("a") as out:
        out.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    ingestion.ingest_event(
        run, rr.Event(type="failed", message="the vLLM server ran out of GPU memory", errors=[])
    )
    page.wait_for("document.getElementById('run-status').textContent.trim() === 'Failed'")
    page.page.wait_for_selector("#failure-reason")
    assert "CUDA out of memory" in page.page.locator("#run-log").inner_text()
    assert page.page.locator("#log-panel[open]").count() == 1
    page.shot("run-failed-log")
    assert page.console_errors == []


def test_every_hf_baseline_is_drawn_on_one_throughput_chart(page: Any, make_user: Any) -> None:
    user, password = user_with_password(make_user, "hana")
    run = webdata.make_baselines_run(user)
    blocked = offline(page)
    page.sign_in(user.username, password)
    page.goto(run.get_absolute_url())
    assert_charts_drawn(page)
    names = page.page.evaluate(
        "() => document.getElementById('chart-concurrency-output').data.map(t => t.name)"
    )
    assert {"vllm", "hf-batched", "ts-cb"} <= set(names)
    assert any(n.startswith("hf-sequential (baseline") for n in names)
    assert any(n.startswith("hf-static-cache (baseline") for n in names)
    legend = page.page.evaluate(
        "() => document.querySelector('#chart-concurrency-output .legend').textContent"
    )
    assert "ts-cb" in legend and "hf-batched" in legend
    speedups = page.page.locator("#speedups").inner_text()
    assert "ts-cb (transformers serve, same point)" in speedups
    page.page.locator("#chart-concurrency-output").scroll_into_view_if_needed()
    page.shot("run-every-hf-baseline")
    assert blocked == []
