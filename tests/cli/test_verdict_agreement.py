"""One verdict: the compare page (and its API), the re-run banner and ``servebench compare``
agree, word for word, on constructed pairs of runs: a real regression, noise-only changes
(measured by repeats, and by the series' history) and a pair that is not comparable.

Runs are stored through the real ingestion service with per-request arrays drawn from a
seeded distribution; the CLI talks to the live test server over HTTP."""

from __future__ import annotations

import json
import random
import statistics
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from portal.benchmarks import documents, ingestion, intake
from portal.benchmarks.models import Run, RunStatus
from runners.result import Measurement
from servebench import stats
from servebench import verdict as v
from servebench.compare import compare_documents

pytestmark = pytest.mark.django_db(transaction=True)

POINTS = (
    ("hf-sequential", "baseline", 1),
    ("vllm", "concurrency:max_concurrency=1", 1),
    ("vllm", "concurrency:max_concurrency=4", 4),
)


def arrays(rng: random.Random, n: int, scale: float) -> dict[str, list[Any]]:
    ttfts = [rng.lognormvariate(-3.0, 0.25) * scale for _ in range(n)]
    itls = [[rng.lognormvariate(-5.0, 0.25) * scale for _ in range(15)] for _ in range(n)]
    return {
        "input_lens": [64] * n,
        "output_lens": [16] * n,
        "ttfts": ttfts,
        "itls": itls,
        "latencies": [t + sum(g) for t, g in zip(ttfts, itls, strict=True)],
        "errors": [""] * n,
    }


def reported(detail: dict[str, list[Any]], concurrency: int) -> dict[str, float]:
    """The bench client's summary of these arrays (vLLM's definitions)."""
    duration = sum(detail["latencies"]) / concurrency
    out = {"output_throughput": sum(detail["output_lens"]) / duration}
    out["request_throughput"] = len(detail["latencies"]) / duration
    for name in v.LATENCY_NAMES:
        values = sorted(stats.latency_samples(detail, name))
        out[f"mean_{name}_ms"] = statistics.fmean(values)
        out[f"median_{name}_ms"] = stats.percentile(values, 50)
        for p in (90, 99):
            out[f"p{p}_{name}_ms"] = stats.percentile(values, p)
    return out


def stored_run(
    owner: Any,
    spec: dict[str, Any],
    scales: list[float],
    seed: int,
    *,
    name: str = "",
    minutes: int = 0,
) -> Run:
    """A succeeded run of ``spec``: one repeat per entry of ``scales`` (latencies scaled by
    it, so throughput by its inverse), created ``minutes`` after now."""
    run = intake.create_run(owner, {**spec, "repeats": len(scales)}, name or None)
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, created_at=timezone.now() + timedelta(minutes=minutes)
    )
    rng = random.Random(seed)
    for repeat, scale in enumerate(scales):
        for backend, key, concurrency in POINTS:
            detail = arrays(rng, 64, scale)
            sweep, _, label = key.partition(":")
            axis, _, value = label.partition("=")
            body = {
                "backend": backend,
                "backend_kind": "hf-sequential" if backend.startswith("hf") else "vllm",
                "point": {
                    "key": key, "sweep": sweep, "axis": axis or None,
                    "value": float(value) if value else None, "input_len": 64,
                    "output_len": 16, "max_concurrency": concurrency, "num_prompts": 64,
                },
                "repeat": repeat, "status": "succeeded", "metrics": reported(detail, concurrency),
                "detail": detail, "raw": {"completed": 64},
                "started_at": "2026-11-30T06:00:00+00:00",
                "finished_at": "2026-11-30T06:00:05+00:00", "duration_s": 5.0,
            }  # fmt: skip
            ingestion.ingest_measurement(run, Measurement.model_validate(body))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    run.refresh_from_db()
    return run


def spec_for(seed: int, dtype: str = "bfloat16") -> dict[str, Any]:
    # A workload seed of its own per scenario: each is a series of its own.
    return {
        "name": "agreement",
        "model": {"id": "org/tiny-model", "max_model_len": 512, "dtype": dtype},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 64, "seed": seed},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1, 4]}],
        "backends": [{"kind": "hf-sequential", "num_prompts": 64}, {"kind": "vllm"}],
        "resources": {"gpu_count": 0, "timeout_minutes": 10},
    }


def scenario(owner: Any, kind: str) -> tuple[Run, Run]:
    """(original, re-run) for one constructed case."""
    if kind == "regression":  # 3 repeats each, the re-run 20% slower
        base = stored_run(owner, spec_for(1), [1.0, 1.01, 0.99], seed=1)
        scales = [1.2, 1.21, 1.19]
        cand_spec = spec_for(1)
    elif kind == "noise (repeats)":  # repeats that drift 15% apart; means differ by ~10%
        base = stored_run(owner, spec_for(2), [1.0, 1.15, 0.87], seed=2)
        scales = [1.12, 0.95, 1.25]
        cand_spec = spec_for(2)
    elif kind == "noise (history)":  # one repeat each; earlier runs varied by ~20%
        for i, scale in enumerate([1.0, 1.25, 0.8, 1.1]):
            stored_run(owner, spec_for(3), [scale], seed=30 + i, minutes=i - 10)
        base = stored_run(owner, spec_for(3), [1.0], seed=3)
        scales = [1.15]
        cand_spec = spec_for(3)
    else:  # not comparable: the re-run measured another workload (an edited spec: its seed)
        base = stored_run(owner, spec_for(4), [1.0, 1.0], seed=4)
        scales = [1.3, 1.3]
        cand_spec = spec_for(44)
    name = f"Re-run of {base.public_id}"
    cand = stored_run(owner, cand_spec, scales, seed=99, name=name, minutes=1)
    return base, cand


EXPECTED = {
    # kind: (exit code, re-run "reproduced", verdict of output_throughput at c=4)
    "regression": (1, False, v.WORSE),
    "noise (repeats)": (0, True, v.NOISE),
    "noise (history)": (0, True, v.NOISE),
    "not comparable": (2, None, v.NOT_COMPARABLE),
}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_page_api_rerun_banner_and_cli_agree(kind, live_server, personas, cli):
    owner = personas["owner"]
    base, cand = scenario(owner.user, kind)
    code, reproduced, headline = EXPECTED[kind]

    # servebench compare, over HTTP (history through the API).
    result = cli(
        "compare", base.public_id, cand.public_id, "--format", "json",
        url=live_server.url, token=owner.token,
    )  # fmt: skip
    assert result.code == code, result.out + result.err
    body = json.loads(result.out)
    from_cli = {
        (p["backend"], p["point"], m["metric"]): m for p in body["points"] for m in p["metrics"]
    }
    judged = from_cli[("vllm", "concurrency:max_concurrency=4", "output_throughput")]
    assert judged["verdict"] == headline, judged
    noise = {"regression": "repeats", "noise (repeats)": "repeats", "noise (history)": "history"}
    assert judged["noise"] == noise.get(kind, "not measured"), judged
    assert abs(judged["change"]) > 0.05  # every case changed beyond the 5% threshold

    # The compare API and page: the same verdicts, number for number.
    url = f"/compare/?runs={base.public_id},{cand.public_id}&reference={base.public_id}"
    api = owner.client.get("/api/v1" + url).json()
    from_api = {}
    for row in api["rows"]:
        judged = row["verdicts"][1]
        if judged is not None:
            from_api[(row["backend"], row["point"], judged["metric"])] = judged
    assert api["runs"][1]["comparable"] is (kind != "not comparable")
    assert api["verdict_rules"]["threshold"] == body["threshold"]
    for key, verdict in from_cli.items():
        assert from_api[key] == {k: verdict[k] for k in from_api[key]}, (key, verdict)

    web = Client()
    web.force_login(owner.user)
    page = web.get(url)
    html = page.content.decode()
    comparison = page.context["comparison"]
    coloured = {
        (r.point.backend, r.point.point_key, r.judgements[1].metric): r.verdicts[1]
        for r in comparison.rows
        if r.judgements[1] is not None
    }
    for key, verdict in from_cli.items():
        assert coloured[key] == (verdict["verdict"] if verdict["verdict"] in v.COLOURED else "")
    assert f'data-verdict="{headline}"' in html
    assert ('id="not-comparable"' in html) is (kind == "not comparable")
    if kind == "not comparable":
        assert "workload.seed: 4 → 44" in html

    # The re-run banner: the same words, and the same outcome.
    run_page = web.get(cand.get_absolute_url())
    banner = run_page.context["verdict"]
    assert banner.reproduced is reproduced, banner.summary
    assert banner.comparable is (kind != "not comparable")
    for check in banner.checks:
        key = (check.backend, check.point_key, check.judgement.metric)
        assert check.judgement.as_dict() == from_cli[key], check.label
    assert len(banner.checks) == (0 if kind == "not comparable" else len(from_cli))
    if kind == "regression":
        assert "Not reproduced" in banner.summary and "worse" in banner.summary
    elif kind == "not comparable":
        assert "workload.seed: 4 vs 44" in banner.summary


def test_the_cli_and_the_documents_give_the_same_comparison(live_server, personas, cli):
    """``compare_documents`` on the API's result documents (what a pipeline can do
    offline) gives what ``servebench compare`` printed."""
    owner = personas["owner"]
    base, cand = scenario(owner.user, "regression")
    result = cli(
        "compare", base.public_id, cand.public_id, "--format", "json",
        url=live_server.url, token=owner.token,
    )  # fmt: skip
    offline = compare_documents(documents.result_document(base), documents.result_document(cand))
    assert json.loads(result.out)["points"] == offline.as_dict()["points"]
