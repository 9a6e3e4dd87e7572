"""Comparison queries and GET /api/v1/compare/: metrics per point relative to a baseline,
the environment diff, visibility, and a fixed number of queries."""

from __future__ import annotations

from typing import Any

import pytest
import webdata
from django.db import connection
from django.test.utils import CaptureQueriesContext

from portal.benchmarks import compare as cmp
from portal.benchmarks.models import Run

pytestmark = pytest.mark.django_db


def test_selection_comes_from_the_url_with_the_first_run_as_default_baseline() -> None:
    assert cmp.parse_selection("abc,def") == (["abc", "def"], "abc")
    assert cmp.parse_selection(["abc", "def,abc"], "def") == (["abc", "def"], "def")
    for runs, baseline, field in [
        ("", None, "runs"),
        ("abc,<script>", None, "runs"),
        ("abc,def", "xyz", "reference"),
        (",".join(f"r{i}" for i in range(cmp.MAX_RUNS + 1)), None, "runs"),
    ]:
        with pytest.raises(cmp.SelectionError) as exc:
            cmp.parse_selection(runs, baseline)
        assert exc.value.field == field


def test_two_runs_differing_only_in_the_vllm_version_show_exactly_that_row(
    make_user: Any,
) -> None:
    owner = make_user("alice")
    a = webdata.make_sweep_run(owner, [1, 4], env=webdata.snapshot(vllm="0.31.0", host="a"))
    b = webdata.make_sweep_run(owner, [1, 4], env=webdata.snapshot(vllm="0.32.0", host="b"))
    comparison = cmp.compare(owner, [a.public_id, b.public_id], a.public_id)
    assert [(row.label, row.values) for row in comparison.env_diff] == [
        ("vLLM", ["0.31.0", "0.32.0"])
    ]


def test_every_field_that_differs_is_listed(make_user: Any) -> None:
    owner = make_user("alice")
    a = webdata.make_sweep_run(owner, [1, 4])
    spec = webdata.sweep_spec([1, 4])
    spec["model"]["dtype"] = "float16"
    spec["backends"][1]["kv_cache_dtype"] = "fp8"
    b = webdata.make_sweep_run(
        owner,
        [1, 4],
        spec=spec,
        env=webdata.snapshot(
            gpu="NVIDIA A100-SXM4-80GB", torch="2.12.0", driver="570.1", image="x/runner:2"
        ),
    )
    comparison = cmp.compare(owner, [a.public_id, b.public_id], a.public_id)
    labels = [row.label for row in comparison.env_diff]
    for label in ("GPU", "Driver", "PyTorch", "dtype", "Image", "vLLM server args (vllm)"):
        assert label in labels, labels
    assert "vLLM" not in labels and "Model revision" not in labels
    args = next(r for r in comparison.env_diff if r.label.startswith("vLLM server args"))
    assert "--kv-cache-dtype fp8" in args.values[1] and "--dtype float16" in args.values[1]


def test_metrics_per_point_are_relative_to_the_baseline(make_user: Any) -> None:
    owner = make_user("alice")
    slow = webdata.make_sweep_run(owner, [1, 4, 16], peak=1000, seed=3)
    fast = webdata.make_sweep_run(owner, [1, 4, 16, 64], peak=2000, seed=3)
    comparison = cmp.compare(owner, [slow.public_id, fast.public_id], slow.public_id)
    rows = {(r.point.point_key, r.metric.key): r for r in comparison.rows}
    row = rows[("concurrency:max_concurrency=4", "output_throughput")]
    assert row.deltas[0] is None
    assert row.deltas[1] == pytest.approx(row.values[1] / row.values[0] - 1)
    assert row.deltas[1] == pytest.approx(1.0, abs=0.1)  # twice the peak
    # The fast run swept one more point: another series, so nothing is judged.
    assert not comparison.columns[1].comparable
    assert [str(d) for d in comparison.columns[1].differences] == [
        "points[concurrency:max_concurrency=64]: — vs present"
    ]
    assert row.verdicts == ["", ""] and row.judgements[1].verdict == "not comparable"
    only_fast = rows[("concurrency:max_concurrency=64", "output_throughput")]
    assert only_fast.values[0] is None and only_fast.deltas == [None, None]
    assert comparison.headline()[1] == pytest.approx(1.0, abs=0.1)
    assert rows[("baseline", "output_throughput")].point.backend == "hf-sequential"


def test_only_what_the_engine_calls_worse_or_better_is_coloured(make_user: Any) -> None:
    owner = make_user("alice")
    slow = webdata.make_sweep_run(owner, [1, 4], peak=1000, seed=3)
    fast = webdata.make_sweep_run(owner, [1, 4], peak=2000, seed=3)
    comparison = cmp.compare(owner, [slow.public_id, fast.public_id], slow.public_id)
    assert comparison.columns[1].comparable
    rows = {(r.point.point_key, r.metric.key): r for r in comparison.rows}
    row = rows[("concurrency:max_concurrency=4", "output_throughput")]
    # Twice the throughput, but one repeat each and no history: the run-to-run noise is
    # not measured, so it is not coloured (and could not fail a build).
    assert row.verdicts == ["", ""]
    assert row.judgements[0] is None and row.judgements[1].verdict == "noise not measured"
    facts = rows[("concurrency:max_concurrency=4", "kv_cache_usage_peak")]
    assert facts.judgements == [None, None]  # not a score: never judged, never coloured
    # With repeats the noise is measured: the same doubling is "better", coloured. (Bob's
    # runs: alice's two runs above are a history of this series that varied twofold.)
    bob = make_user("bob")
    slow3 = webdata.make_sweep_run(bob, [1, 4], peak=1000, seed=3, repeats=3)
    fast3 = webdata.make_sweep_run(bob, [1, 4], peak=2000, seed=4, repeats=3)
    comparison = cmp.compare(bob, [slow3.public_id, fast3.public_id], slow3.public_id)
    rows = {(r.point.point_key, r.metric.key): r for r in comparison.rows}
    row = rows[("concurrency:max_concurrency=4", "output_throughput")]
    assert row.verdicts == ["", "better"] and row.judgements[1].noise == "repeats"
    assert comparison.counts(1)["better"] >= 1 and comparison.counts(0) == {}


def test_compare_reads_a_fixed_number_of_queries(make_user: Any) -> None:
    owner = make_user("alice")
    few = [webdata.make_sweep_run(owner, [1, 4], seed=i) for i in range(2)]
    many = [
        webdata.make_sweep_run(owner, [1, 2, 4, 8, 16, 32], slo={"ttft_ms": 500}, seed=i)
        for i in range(6)
    ]
    counts = []
    for runs in (few, many):
        ids = [r.public_id for r in runs]
        with CaptureQueriesContext(connection) as ctx:
            cmp.compare(owner, ids, ids[0])
        counts.append(len(ctx.captured_queries))
    # runs, measurements, environments, goodput arrays (with an SLO), the series' earlier
    # runs and their values (history), the samples of changes beyond the threshold.
    assert counts[0] <= 6 and counts[1] <= 7, counts


def test_a_run_you_cannot_see_makes_the_whole_comparison_404(make_user: Any) -> None:
    alice, bob = make_user("alice"), make_user("bob")
    mine = webdata.make_sweep_run(alice, [1])
    theirs = webdata.make_sweep_run(bob, [1])
    with pytest.raises(Run.DoesNotExist):
        cmp.compare(alice, [mine.public_id, theirs.public_id], mine.public_id)
    Run.objects.filter(pk=theirs.pk).update(is_public=True)
    assert len(cmp.compare(alice, [mine.public_id, theirs.public_id], mine.public_id).columns) == 2


def test_the_compare_api_answers_owners_and_refuses_others(personas: Any) -> None:
    owner = personas["owner"].user
    a = webdata.make_sweep_run(owner, [1, 4], env=webdata.snapshot(vllm="0.31.0"))
    b = webdata.make_sweep_run(owner, [1, 4], env=webdata.snapshot(vllm="0.32.0"))
    url = f"/api/v1/compare/?runs={a.public_id},{b.public_id}&baseline={b.public_id}"
    body = personas["owner"].client.get(url).json()
    assert body["baseline"] == b.public_id
    assert [r["id"] for r in body["runs"]] == [a.public_id, b.public_id]
    assert body["environment_diff"] == [{"field": "vLLM", "values": ["0.31.0", "0.32.0"]}]
    row = next(
        r for r in body["rows"] if r["metric"] == "output_throughput" and r["point"].endswith("=4")
    )
    assert row["relative_to_baseline"][1] is None
    assert row["relative_to_baseline"][0] == pytest.approx(row["values"][0] / row["values"][1] - 1)
    for who in ("other", "anon"):
        response = personas[who].client.get(url)
        assert response.status_code == 404, who
        assert response.json()["error"]["code"] == "not_found"
    bad = personas["owner"].client.get(f"/api/v1/compare/?runs={a.public_id}&baseline=zzz")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "baseline"
