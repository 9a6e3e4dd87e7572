"""Noise where people look: the run page's headline cards and summary table show how well
each number is known (the spread over repeats, or the request-level interval of a point
measured once) and warn in plain words when the sample is too small to trust a difference
of the size the page shows."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import webdata
from django.test import Client

from portal.benchmarks import points as pts
from portal.benchmarks import runview, samples
from portal.benchmarks.models import Measurement

pytestmark = pytest.mark.django_db


def page(user: Any, run: Any) -> Any:
    client = Client()
    client.force_login(user)
    response = client.get(run.get_absolute_url())
    assert response.status_code == 200
    return response


def test_one_repeat_shows_the_request_level_interval_and_says_what_it_misses(
    make_user: Any,
) -> None:
    owner = make_user("alice")
    run = webdata.make_sweep_run(owner, [1, 4, 16])
    response = page(owner, run)
    html = response.content.decode()
    summary = response.context["summary"]
    best = summary["best"]["noise"]
    assert best.method == "request-level" and best.samples == 32 and best.low < best.high
    assert "95% request-level interval, 32 requests, 1 repeat" in html
    # The HF baseline reported no per-request samples: said, not hidden.
    assert summary["hf_noise"] is None
    assert 'id="hf-noise">noise not measured<' in html
    warning = re.search(r'id="noise-warning">(.*?)</div>', html, re.S).group(1)
    assert "measured once without per-request samples" in warning
    assert "run-to-run noise" in warning and "repeats: 2" in warning
    # The summary table: every judged cell of a point measured once carries its interval;
    # 32 requests cannot bound a p99 (order statistics): it says so.
    spreads = re.findall(r'<span class="spread" title="([^"]*)">([^<]*)</span>', html)
    assert spreads and all("request-level" in title for title, _ in spreads)
    assert any(text == "±∞" for _, text in spreads) and any("%" in text for _, text in spreads)


def test_repeats_show_their_spread_and_a_wide_one_is_a_warning(make_user: Any) -> None:
    owner = make_user("alice")
    run = webdata.make_sweep_run(owner, [1, 4, 16], repeats=3)
    summary = page(owner, run).context["summary"]
    best, hf = summary["best"]["noise"], summary["hf_noise"]
    assert best.method == hf.method == "repeats" and best.repeats == 3
    # The HF baseline's repeats (40, 41, 42 tok/s) make a ±6% interval: wider than the 5%
    # a gate calls a change, so the page says a difference that small is not one.
    assert hf.relative > 0.05
    assert any(
        "Known only roughly" in w and "the hf-sequential baseline's output tok/s ±" in w
        for w in summary["noise_warnings"]
    )
    low, high = summary["speedup_range"]
    assert low < summary["speedup"] < high
    assert low == pytest.approx(best.low / hf.high) and high == pytest.approx(best.high / hf.low)


def test_request_level_intervals_come_from_the_samples(make_user: Any) -> None:
    owner = make_user("alice")
    run = webdata.make_sweep_run(owner, [4])
    results = runview.load(run).results
    pts.attach_request_intervals(results)
    point = next(p for p in results.points if p.backend_kind == "vllm")
    detail = samples.details(Measurement.objects.filter(pk=point.ids[0]))[point.ids[0]]
    ttfts = sorted(t * 1000 for t in detail["ttfts"])
    median = point.uncertainty("p50_ttft_ms")
    assert median.method == "order statistics"
    assert median.low <= ttfts[len(ttfts) // 2] <= median.high
    assert math.isinf(point.uncertainty("p99_ttft_ms").high)  # 32 requests: unbounded
    assert point.uncertainty("p99_itl_ms") is None  # token gaps are not read for a page
    rate = point.uncertainty("output_throughput")
    assert rate.low < point.get("output_throughput") < rate.high


def test_samples_are_read_through_one_function(make_user: Any) -> None:
    run = webdata.make_sweep_run(make_user("alice"), [4])
    m = Measurement.objects.get(run=run, backend_kind="vllm")
    full = samples.details([m])[m.pk]
    assert set(full) >= {"ttfts", "itls", "latencies", "output_lens"}
    light = samples.details([m.pk], ["ttfts", "latencies"], with_duration=True)[m.pk]
    assert set(light) == {"ttfts", "latencies", "duration"}
    assert light["ttfts"] == full["ttfts"]
    assert samples.details([]) == {}
    with pytest.raises(ValueError, match="keys: unknown per-request array 'bogus'"):
        samples.details([m], ["bogus"])
