"""Every Hugging Face baseline on the run page: hf-sequential and hf-static-cache as
reference lines, hf-batched as a series on the same throughput chart, and the headline's
speedup against each (stored through the real ingestion service)."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
import webdata
from django.test import Client

from portal.benchmarks import commands, services
from portal.benchmarks.models import Run, RunStatus
from runners import result as rr
from runners import spec as rs

pytestmark = pytest.mark.django_db

CONCURRENCY = [1, 4]


def _baseline(kind: str, throughput: float) -> rr.Measurement:
    m = webdata.hf_measurement(throughput)
    return m.model_copy(update={"backend": kind, "backend_kind": kind, "commands": {}})


def _run(owner: Any) -> Run:
    spec = webdata.sweep_spec(CONCURRENCY)
    spec["backends"] = [
        {"kind": "hf-sequential", "num_prompts": 4},
        {"kind": "hf-static-cache", "num_prompts": 4, "compile_backend": "aot_eager"},
        {"kind": "hf-batched"},
        {"kind": "vllm"},
    ]
    run = services.create_run(owner, spec, "baselines")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    run.refresh_from_db()
    services.store_environment(run, webdata.snapshot(), "f" * 64)
    services.ingest_measurement(run, _baseline("hf-sequential", 40.0))
    services.ingest_measurement(run, _baseline("hf-static-cache", 80.0))
    base, rng = webdata.recording(), random.Random(1)
    for c in CONCURRENCY:
        data = webdata.scaled_point(base, c, rng)
        m = webdata.vllm_measurement("concurrency", "max_concurrency", c, data)
        services.ingest_measurement(run, m)
        batched = m.model_copy(
            update={
                "backend": "hf-batched",
                "backend_kind": "hf-batched",
                "metrics": {**m.metrics, "output_throughput": 50.0 * c},
                "commands": {},
            }
        )
        services.ingest_measurement(run, batched)
    services.ingest_event(run, rr.Event(type="finished", status="succeeded", errors=[]))
    run.refresh_from_db()
    return run


def test_one_chart_draws_every_baseline_and_the_headline_says_each_speedup(make_user):
    run = _run(make_user())
    client = Client()
    client.force_login(run.owner)
    page = client.get(run.get_absolute_url())
    assert page.status_code == 200
    figures = {f["id"]: f["figure"] for f in page.context["figures"]}
    names = [t["name"] for t in figures["concurrency-output"]["data"]]
    assert "vllm" in names and "hf-batched" in names
    assert any(n.startswith("hf-sequential (baseline") for n in names)
    assert any(n.startswith("hf-static-cache (baseline") for n in names)
    summary = page.context["summary"]
    best = summary["best"]["output_throughput"]
    found = {s["backend"]: s["speedup"] for s in summary["speedups"]}
    assert set(found) == {"hf-sequential", "hf-static-cache", "hf-batched"}
    assert found["hf-sequential"] == pytest.approx(best / 40.0)
    assert found["hf-static-cache"] == pytest.approx(best / 80.0)
    assert found["hf-batched"] == pytest.approx(best / 200.0)  # the same point, c=4
    html = page.content.decode()
    line = re.search(r'<p class="speedups" id="speedups">(.*?)</p>', html, re.S)
    assert line is not None
    text = re.sub(r"<[^>]+>", "", line.group(1))
    assert "hf-sequential" in text and "hf-static-cache" in text and "hf-batched" in text


def test_the_implied_commands_name_each_baselines_own_module():
    spec = rs.parse_spec(
        webdata.sweep_spec(CONCURRENCY)
        | {
            "backends": [
                {"kind": "hf-static-cache", "compile_backend": "aot_eager"},
                {"kind": "hf-batched"},
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
