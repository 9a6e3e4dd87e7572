"""A sessions run as the runner reports it: the measurement's traffic facts (send lag,
per-turn TTFT and prefix hits, greedy agreement) reach the run page's traffic section,
the correctness metric the results table, and nobody else sees the run."""

from __future__ import annotations

import json
from typing import Any

from django.test import Client

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.benchmarks.models import Run, RunStatus
from runners import spec as rs
from runners.vllm_bench import point_info

SPEC = {
    "name": "sessions",
    "model": {"id": "org/tiny-model", "max_model_len": 512},
    "workload": {"input_len": 32, "output_len": 8, "num_warmups": 0,
                 "sessions": {"num_sessions": 4, "turns": 2}},
    "backends": [{"kind": "vllm"}],
    "correctness": {"sample": 4},
    "resources": {"gpu_count": 0, "timeout_minutes": 10},
}  # fmt: skip
TRAFFIC = {
    "mode": "sessions",
    "sessions": 4,
    "lag": {"mean_ms": 30.0, "p50_ms": 20.0, "p99_ms": 95.5, "max_ms": 120.0,
            "limit_ms": 50.0, "kept_up": False, "late_requests": 2,
            "note": "the client could not keep up: p99 send lag 95.5 ms is above 50 ms"},
    "per_turn": [
        {"turn": 1, "requests": 4, "mean_input_tokens": 32.0, "mean_ttft_ms": 11.0,
         "p99_ttft_ms": 14.0, "mean_e2el_ms": 40.0, "prefix_cache_hit_rate": 0.0},
        {"turn": 2, "requests": 4, "mean_input_tokens": 72.0, "mean_ttft_ms": 9.0,
         "p99_ttft_ms": 12.0, "mean_e2el_ms": 38.0, "prefix_cache_hit_rate": 0.44},
    ],
    "prefix_cache_hit_rate": 0.3,
    "correctness": {"metrics": {"greedy_agreement": 0.875}},
}  # fmt: skip


def post(client: Any, run: Run, what: str, data: dict[str, Any]) -> Any:
    return client.post(
        f"/api/v1/runner/runs/{run.public_id}/{what}", json.dumps(data),
        content_type="application/json",
    )  # fmt: skip


def test_a_sessions_run_shows_its_traffic_on_the_run_page(make_run, personas, bearer_client):
    owner = personas["owner"]
    run = make_run(owner=owner.user, spec=SPEC)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.DISPATCHED)
    runner = bearer_client(issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run).plaintext)
    spec = rs.parse_spec(run.spec)
    assert post(runner, run, "events", {"type": "started", "total": 1}).status_code == 200
    environment = {"gpu": {"model": "none", "count": 0}}
    assert post(runner, run, "events", {"type": "environment", "environment": environment})
    (point,) = spec.points()
    body = {
        "backend": "vllm", "backend_kind": "vllm",
        "point": point_info(point).model_dump(mode="json"), "repeat": 0,
        "status": "succeeded",
        "metrics": {"output_throughput": 100.0, "mean_ttft_ms": 10.0, "completed": 8.0,
                    "greedy_agreement": 0.875},
        "commands": {"bench": "python -m runners.traffic --spec s.json ..."},
        "raw": {"traffic": TRAFFIC, "num_prompts": 8},
        "started_at": "2026-11-30T06:00:00.000+00:00",
        "finished_at": "2026-11-30T06:00:05.000+00:00", "duration_s": 5.0,
    }  # fmt: skip
    assert post(runner, run, "measurements", body).status_code == 201
    response = post(runner, run, "events", {"type": "finished", "status": "succeeded"})
    assert response.json()["run_status"] == "succeeded"

    page = Client()
    page.force_login(owner.user)
    html = page.get(run.get_absolute_url()).content.decode()
    assert 'id="traffic-points"' in html and "sessions (4 sessions)" in html
    assert "95.5" in html and "the client could not keep up" in html
    assert html.count('<tr><td class="num">') >= 2  # one row per turn
    assert "72.0" in html and "44%" in html and "88%" in html  # input grows; hits; agreement
    assert "Greedy agreement" in html
    other = Client()
    other.force_login(personas["other"].user)
    assert other.get(run.get_absolute_url()).status_code == 404
