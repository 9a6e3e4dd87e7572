"""Every Hugging Face baseline on the run page: hf-sequential and hf-static-cache as
reference lines, hf-batched and transformers serve as series on the same throughput chart,
and the headline's speedup against each (stored through the real ingestion service)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import webdata
from django.test import Client

from portal.benchmarks import commands
from portal.benchmarks.models import Run
from runners import spec as rs

pytestmark = pytest.mark.django_db

CONCURRENCY = webdata.BASELINES_CONCURRENCY


def _run(owner: Any) -> Run:
    return webdata.make_baselines_run(owner)


def test_one_chart_draws_every_baseline_and_the_headline_says_each_speedup(make_user):
    run = _run(make_user())
    client = Client()
    client.force_login(run.owner)
    page = client.get(run.get_absolute_url())
    assert page.status_code == 200
    figures = {f["id"]: f["figure"] for f in page.context["figures"]}
    names = [t["name"] for t in figures["concurrency-output"]["data"]]
    assert "vllm" in names and "hf-batched" in names and "ts-cb" in names
    assert any(n.startswith("hf-sequential (baseline") for n in names)
    assert any(n.startswith("hf-static-cache (baseline") for n in names)
    summary = page.context["summary"]
    best = summary["best"]["output_throughput"]
    found = {s["backend"]: s["speedup"] for s in summary["speedups"]}
    assert set(found) == {"hf-sequential", "hf-static-cache", "hf-batched", "ts-cb"}
    assert found["hf-sequential"] == pytest.approx(best / 40.0)
    assert found["hf-static-cache"] == pytest.approx(best / 80.0)
    assert found["hf-batched"] == pytest.approx(best / 200.0)  # the same point, c=4
    assert found["ts-cb"] == pytest.approx(best / 400.0)
    html = page.content.decode()
    line = re.search(r'<p class="speedups" id="speedups">(.*?)</p>', html, re.S)
    assert line is not None
    text = re.sub(r"<[^>]+>", "", line.group(1))
    assert "hf-sequential" in text and "hf-static-cache" in text and "hf-batched" in text
    assert "ts-cb (transformers serve, same point)" in text


def test_the_implied_commands_name_each_baselines_own_module():
    spec = rs.parse_spec(
        webdata.sweep_spec(CONCURRENCY)
        | {
            "backends": [
                {"kind": "hf-static-cache", "compile_backend": "aot_eager"},
                {"kind": "hf-batched"},
                {"kind": "transformers-serve", "continuous_batching": False, "api": "chat"},
            ]
        }
    )
    static = commands.implied(spec, "hf-static-cache", "baseline")["hf"]
    assert static.startswith("python -m runners.hf_baselines static-cache --model org/tiny-model")
    assert static.endswith("--compile-backend aot_eager")
    key = spec.points()[1].key
    batched = commands.implied(spec, "hf-batched", key)["hf"]
    assert batched.startswith("python -m runners.hf_baselines batched")
    assert batched.endswith("--batch-size 4")
    assert commands.implied(spec, "hf-batched", "baseline") == {}
    served = commands.implied(spec, "transformers-serve", key)
    assert served["serve"].startswith("transformers serve org/tiny-model --host 127.0.0.1")
    assert "--no-continuous-batching" in served["serve"]
    assert served["bench"].startswith(
        "python -m runners.bench_client --transformers-fields --backend openai-chat "
    )
    assert "--ignore-eos" in served["bench"]  # the adapter sends it as a generation_config


def _page(run: Run) -> Any:
    client = Client()
    client.force_login(run.owner)
    page = client.get(run.get_absolute_url())
    assert page.status_code == 200
    return client, page


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_the_headline_speedup_is_over_the_sequential_loop_whatever_the_names(make_user):
    # The compiled loop's name sorts first; the sequential loop is still the reference,
    # and every label names it.
    single = (("aa-compiled", "hf-static-cache", 80.0), ("zz-loop", "hf-sequential", 40.0))
    run = webdata.make_baselines_run(make_user(), single)
    client, page = _page(run)
    summary = page.context["summary"]
    best = summary["best"]["output_throughput"]
    assert summary["reference"] == "zz-loop"
    assert summary["hf_output_throughput"] == 40.0
    assert summary["speedup"] == pytest.approx(best / 40.0)
    assert [s["backend"] for s in summary["speedups"]][:2] == ["zz-loop", "aa-compiled"]
    vllm_rows = [r for r in page.context["summary_rows"] if r.point.backend_kind == "vllm"]
    assert vllm_rows and all(
        r.speedup == pytest.approx(r.point.get("output_throughput") / 40.0) for r in vllm_rows
    )
    text = _text(page.content.decode())
    assert "zz-loop output tok/s (HF baseline)" in text
    assert "vLLM speedup over zz-loop" in text
    figure = {f["id"]: f["figure"] for f in page.context["figures"]}["concurrency-output"]
    assert figure["layout"]["annotations"], "the chart labels its points with the speedup"
    assert "times zz-loop" in _text(str(figure))
    points = client.get(f"{run.get_absolute_url()}points.json").json()["points"]
    vllm = [p for p in points if p["backend_kind"] == "vllm"]
    assert {p["speedup_reference"] for p in points} == {"zz-loop"}
    assert all(p["speedup_vs_hf"] == pytest.approx(p["output_throughput"] / 40) for p in vllm)


def test_a_run_without_the_sequential_loop_never_calls_its_baseline_sequential(make_user):
    run = webdata.make_baselines_run(make_user(), (("hf-static-cache", "hf-static-cache", 80.0),))
    _, page = _page(run)
    summary = page.context["summary"]
    assert summary["reference"] == "hf-static-cache"
    assert summary["speedup"] == pytest.approx(summary["best"]["output_throughput"] / 80.0)
    html = page.content.decode()
    assert "sequential" not in _text(html).lower().replace("hf-sequential", "")
    assert "hf-static-cache output tok/s (HF baseline)" in _text(html)


def test_a_run_accepted_before_a_rule_tightened_stays_readable(make_user):
    # hf-batched under a request rate is refused now; a run stored before that rule (its
    # spec written as it was accepted) still shows its page, its spec and its compare.
    run = _run(make_user())
    rated = {
        **run.spec,
        "sweeps": [{"name": "rate", "axis": "request_rate", "values": [1.0, 2.0]}],
    }
    with pytest.raises(rs.SpecError) as caught:
        rs.parse_spec(rated)
    assert caught.value.errors[0]["field"] == "sweeps.0.axis"
    Run.objects.filter(pk=run.pk).update(spec=rated)
    run.refresh_from_db()
    client, page = _page(run)
    assert "hf-batched" in page.content.decode()
    spec = client.get(f"/api/v1/runs/{run.public_id}/spec?format=json")
    assert spec.status_code == 200, spec.content
    assert spec.json()["sweeps"][0]["axis"] == "request_rate"
    compare = client.get(f"/compare/?runs={run.public_id},{_run(run.owner).public_id}")
    assert compare.status_code in (200, 302)
    # Submitted again, the same spec is refused at its field.
    again = client.post("/api/v1/runs/", {"spec": rated}, content_type="application/json")
    assert again.status_code == 400
    assert "sweeps.0.axis" in again.content.decode()
    # So is a re-run: said on the run's page, with what to do, and nothing queued.
    before = Run.objects.count()
    rerun = client.post(f"/runs/{run.public_id}/rerun/", follow=True)
    assert rerun.status_code == 200 and Run.objects.count() == before
    said = _text(rerun.content.decode())
    assert "cannot be re-run as it is: sweeps.0.axis: hf-batched" in said
    assert "change what is named" in said
