"""Endpoint backends and SLA searches in the portal: what a spec may ask (policy), what a
runner may report (ingestion), and the answer on every surface (result document, API,
run page, CLI rendering), with the owner, another user and an anonymous reader."""

from __future__ import annotations

import json
from typing import Any

import pytest

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.benchmarks import documents, ingestion, intake, policy
from portal.benchmarks.models import Run, RunStatus
from runners import sla
from runners import spec as rs
from runners.vllm_bench import point_info
from servebench import render

pytestmark = pytest.mark.django_db

PROD = {
    "kind": "endpoint",
    "name": "prod",
    "base_url": "http://vllm.prod.svc.cluster.local:8000",
    "model": "qwen3",
    "api_key": {"env": "PROD_VLLM_BEARER"},
}
SEARCH = {
    "axis": "request_rate",
    "slo": {"p99_ttft_ms": 500},
    "low": 1,
    "high": 64,
    "max_points": 10,
}


def endpoint_spec(**extra: Any) -> dict[str, Any]:
    return {
        "name": "prod SLA",
        "model": {"id": "org/tiny-model", "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 16, "num_warmups": 0},
        "backends": [PROD],
        "sla_search": SEARCH,
        **extra,
    }


@pytest.fixture
def allowed(settings: Any) -> Any:
    settings.SERVEBENCH_ENDPOINT_HOSTS = ["*.svc.cluster.local", "10.0.0.7:8000"]
    settings.SERVEBENCH_ENDPOINT_KEY_ENVS = ["PROD_VLLM_BEARER"]
    settings.SERVEBENCH_EXECUTOR = "local"
    return settings


def refusal(user: Any, spec: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(rs.SpecError) as caught:
        intake.spec_from_request({"spec": spec}, user)
    return caught.value.errors[0]


# --------------------------------------------------------------------------- policy


def test_hosts_match_exactly_by_domain_or_with_their_port():
    allowed = ["*.svc.cluster.local", "api.example.com", "10.0.0.7:8000", "[::1]:9000"]
    assert policy.host_allowed("vllm.prod.svc.cluster.local", "8000", allowed)
    assert not policy.host_allowed("svc.cluster.local", "80", allowed)  # under it, not it
    assert not policy.host_allowed("evil-svc.cluster.local.attacker.io", "80", allowed)
    assert policy.host_allowed("API.example.com", "443", allowed)
    assert policy.host_allowed("10.0.0.7", "8000", allowed)
    assert not policy.host_allowed("10.0.0.7", "22", allowed)
    assert policy.host_allowed("[::1]", "9000", allowed)
    assert not policy.host_allowed("vllm.prod.svc.cluster.local", "8000", [])


def test_the_api_refuses_an_endpoint_host_the_admin_did_not_allow(allowed, personas):
    spec = endpoint_spec(backends=[{**PROD, "base_url": "http://169.254.169.254"}])
    response = personas["owner"].client.post(
        "/api/v1/runs/", json.dumps({"spec": spec}), content_type="application/json"
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == "spec.backends.0.base_url"
    assert "SERVEBENCH_ENDPOINT_HOSTS" in error["message"]
    assert not Run.objects.exists()
    assert personas["anon"].client.post(
        "/api/v1/runs/", json.dumps({"spec": endpoint_spec()}), content_type="application/json"
    ).status_code in (401, 403)


def test_a_key_comes_only_from_where_the_admin_said(allowed, make_user):
    user = make_user()
    # Another credential of the runner, sent to an allowed host: refused.
    other = refusal(user, endpoint_spec(backends=[{**PROD, "api_key": {"env": "HF_TOKEN"}}]))
    assert other["field"] == "spec.backends.0.api_key.env"
    assert "SERVEBENCH_ENDPOINT_KEY_ENVS" in other["message"]
    secret = refusal(user, endpoint_spec(backends=[{**PROD, "api_key": {"secret": "k"}}]))
    assert secret["field"] == "spec.backends.0.api_key.secret"
    assert "use api_key.env" in secret["message"]
    accepted = intake.spec_from_request({"spec": endpoint_spec()}, user)
    assert accepted.spec.resources.gpu_count == 0
    assert "PROD_VLLM_BEARER" in json.dumps(accepted.spec.model_dump(mode="json"))  # the name
    # The key's name is not what the run puts under test (nor what it measured).
    assert "api_key" not in json.dumps(intake.identity(accepted.spec).configuration)
    assert "PROD_VLLM_BEARER" not in json.dumps(intake.identity(accepted.spec).measurement)


def test_a_local_lora_adapter_must_lie_under_the_model_roots(allowed, make_user, settings):
    settings.SERVEBENCH_MODEL_ROOTS = ["/models"]
    spec = {
        "model": {"id": "org/tiny-model", "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16},
        "backends": [{"kind": "vllm", "lora_adapters": [{"name": "a", "path": "/etc"}]}],
        "resources": {"gpu_count": 0},
    }
    error = refusal(make_user(), spec)
    assert error["field"] == "spec.backends.0.lora_adapters.0.path"
    assert "SERVEBENCH_MODEL_ROOTS" in error["message"]
    spec["backends"][0]["lora_adapters"][0]["path"] = "/models/adapters/a"
    intake.spec_from_request({"spec": spec}, make_user("u2"))


# --------------------------------------------------------------------------- a search


@pytest.fixture
def searching(allowed, make_run, personas, bearer_client):
    """A running endpoint run with an SLA search, and its runner's client."""
    run = make_run(owner=personas["owner"].user, spec=endpoint_spec())
    Run.objects.filter(pk=run.pk).update(status=RunStatus.DISPATCHED)
    token = issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run).plaintext
    return run, bearer_client(token)


def body(spec: rs.Spec, point: rs.Point, p99_ttft: float, **extra: Any) -> dict[str, Any]:
    return {
        "backend": "prod",
        "backend_kind": "endpoint",
        "point": point_info(point).model_dump(mode="json"),
        "repeat": 0,
        "status": "succeeded",
        "metrics": {"output_throughput": 100.0, "p99_ttft_ms": p99_ttft, "completed": 16.0},
        "commands": {"bench": "vllm bench serve --backend openai ..."},
        "raw": {
            "servebench": {
                "api": "completions",
                "request_fields": "openai",
                "output_len": "not forced",
                "requested_output_len": 16,
                "short_responses": 3,
                "responses": 16,
            }
        },
        "started_at": "2026-11-30T06:00:00.000+00:00",
        "finished_at": "2026-11-30T06:00:05.000+00:00",
        "duration_s": 5.0,
        **extra,
    }


def post(client: Any, run: Run, what: str, data: dict[str, Any]) -> Any:
    return client.post(
        f"/api/v1/runner/runs/{run.public_id}/{what}",
        json.dumps(data),
        content_type="application/json",
    )


def test_a_search_is_stored_and_its_answer_shown_everywhere(searching, personas):
    run, runner = searching
    spec = rs.parse_spec(run.spec)
    assert run.progress_total == 1 + 10  # the sweep point and the search's budget
    assert post(runner, run, "events", {"type": "started", "total": 11}).status_code == 200
    environment = {
        "gpu": {"model": "none", "count": 0},
        "endpoints": {
            "prod": {"base_url": PROD["base_url"], "engine": "vllm", "version": "0.32.0"}
        },
    }
    response = post(runner, run, "events", {"type": "environment", "environment": environment})
    assert response.status_code == 200
    (single,) = spec.points()
    assert post(runner, run, "measurements", body(spec, single, 80.0)).status_code == 201
    # The runner's search, as runners.runner drives it, against "a server" that holds
    # p99 TTFT under 500 ms up to 12.7 req/s.
    measured: list[dict[str, Any]] = []
    steps: list[sla.Step] = []
    while (value := sla.next_value(spec.sla_search, steps)) is not None:
        data = body(spec, rs.search_point(spec, value), 120.0 if value <= 12.7 else 3000.0)
        assert post(runner, run, "measurements", data).status_code == 201
        measured.append(data)
        steps = sla.steps_of(spec, "prod", measured)
    assert len(steps) < 10  # converged before its budget
    response = post(runner, run, "events", {"type": "finished", "status": "succeeded"})
    assert response.json()["run_status"] == "succeeded", Run.objects.get(pk=run.pk).failure_reason
    run.refresh_from_db()
    assert run.progress_total == run.progress_done == 1 + len(steps)

    # The API's result document: the same answer the runner computed.
    owner, other, anon = personas["owner"], personas["other"], personas["anon"]
    document = owner.client.get(f"/api/v1/runs/{run.public_id}/result").json()
    (search,) = document["sla_searches"]
    assert search == sla.result(spec, "prod", steps)
    assert search["state"] == "converged"
    assert search["text"] == f"{search['answer']:g} req/s at p99 TTFT <= 500 ms"
    assert 12.7 / 1.1 <= search["answer"] <= 12.7
    for reader in (other, anon):  # a private run: nobody else reads it
        assert reader.client.get(f"/api/v1/runs/{run.public_id}/result").status_code == 404

    # The CLI's table and PR comment.
    lines = render.results_table(document).splitlines()
    assert lines[-1].startswith(f"SLA search on prod: {search['text']} (converged, ")
    comment = render.results_markdown({"id": run.public_id}, document)
    assert render.md(search["text"]) in comment

    # The run page: the answer, the path, the endpoint, and the lengths that were not forced.
    from django.test import Client
    from django.utils.html import escape

    page = Client()
    page.force_login(owner.user)
    html = page.get(run.get_absolute_url()).content.decode()
    assert escape(search["text"]) in html and 'id="sla-path-1"' in html
    assert html.count("<td>met</td>") == sum(s.passed for s in steps)
    assert 'id="endpoint-facts"' in html and "0.32.0" in html
    assert 'id="output-length-note"' in html and "3 of 16 responses ended before 16" in html


def test_a_search_the_run_left_unfinished_is_stopped_not_running(searching, personas):
    """The endpoint died mid-search: the ended run's page, result document and CLI say
    what the search learned as a bound (at least 1 req/s), never "so far"."""
    from django.test import Client
    from django.utils.html import escape

    run, runner = searching
    spec = rs.parse_spec(run.spec)
    first = body(spec, rs.search_point(spec, 1), 100.0)
    assert post(runner, run, "measurements", first).status_code == 201
    died = {**body(spec, rs.search_point(spec, 64), 0.0), "status": "failed", "metrics": {}}
    died["error"] = "the endpoint stopped answering"
    assert post(runner, run, "measurements", died).status_code == 201
    (live,) = ingestion.sla_searches(run)
    assert live["state"] == "running"
    response = post(runner, run, "events", {"type": "failed", "message": "endpoint gone"})
    assert response.json()["run_status"] == "failed"
    run.refresh_from_db()
    document = personas["owner"].client.get(f"/api/v1/runs/{run.public_id}/result").json()
    (search,) = document["sla_searches"]
    assert (search["state"], search["answer"], search["finished"]) == ("stopped", 1.0, False)
    assert search["text"].startswith("at least 1 req/s at p99 TTFT <= 500 ms (stopped after 2")
    assert "so far" not in render.results_table(document)
    page = Client()
    page.force_login(run.owner)
    html = page.get(run.get_absolute_url()).content.decode()
    assert escape(search["text"]) in html and "so far" not in html


def test_search_points_the_search_could_not_have_made_are_refused(searching):
    run, runner = searching
    spec = rs.parse_spec(run.spec)
    outside = body(spec, rs.search_point(spec, 1), 100.0)
    outside["point"]["key"] = "sla:request_rate=65"
    response = post(runner, run, "measurements", outside)
    assert response.status_code == 400 and response.json()["error"]["field"] == "point.key"
    low = rs.search_point(spec, 1)
    response = post(runner, run, "measurements", body(spec, low, 100.0, repeat=1))
    assert response.status_code == 400, "nothing to measure again yet"
    assert response.json()["error"]["field"] == "repeat"
    # The low end missed (a stall): the search measures it again, once.
    assert post(runner, run, "measurements", body(spec, low, 3100.0)).status_code == 201
    assert post(runner, run, "measurements", body(spec, low, 100.0, repeat=1)).status_code == 201
    response = post(runner, run, "measurements", body(spec, low, 100.0, repeat=2))
    assert response.status_code == 400
    assert "once more at repeat 1" in response.json()["error"]["message"]
    top = rs.search_point(spec, 64)
    response = post(runner, run, "measurements", body(spec, top, 100.0, repeat=1))
    assert response.status_code == 400 and response.json()["error"]["field"] == "repeat"
    assert post(runner, run, "measurements", body(spec, top, 9000.0)).status_code == 201
    for value in (2, 3, 4, 5, 6, 8, 16):  # the rest of the budget: the repeat counts
        data = body(spec, rs.search_point(spec, value), 1.0)
        assert post(runner, run, "measurements", data).status_code == 201
    one_more = body(spec, rs.search_point(spec, 48), 100.0)
    response = post(runner, run, "measurements", one_more)
    assert response.status_code == 400
    assert "has measured its 10 points" in response.json()["error"]["message"]
    # A retry of one already stored is still the same measurement, not one too many.
    retry = body(spec, rs.search_point(spec, 8), 1.0)
    assert post(runner, run, "measurements", retry).status_code == 200


def test_the_page_shows_the_commands_the_runner_ran_for_endpoints_and_searches():
    from pathlib import Path

    from portal.benchmarks import commands
    from runners.hf_config import from_spec as hf_config
    from runners.vllm_bench import bench_command, bench_flags

    spec = rs.parse_spec(
        endpoint_spec(
            workload={"dataset": "custom", "dataset_path": "/data/p.jsonl", "num_prompts": 8},
            backends=[{"kind": "hf-sequential"}, {**PROD, "api": "chat"}],
            resources={"gpu_count": 0},
        )
    )
    hf, prod = spec.backends
    assert commands.hf_command(spec, hf) == hf_config(spec, hf).command()
    for point in (spec.points()[0], rs.search_point(spec, 12.5)):
        stem = point.key.replace(":", "-").replace("=", "")  # as runners.vllm_bench names it
        result = Path("/work/run") / f"prod-{stem}-r0.json"
        reported = bench_command(bench_flags(spec, point, prod.base_url, result, prod), prod)
        assert commands.shown(spec, "prod", point.key, {"bench": reported}) == {
            "commands": {"bench": reported},
            "replaced": [],
        }
        assert "serve" not in commands.implied(spec, "prod", point.key)


def test_a_confirmed_load_shows_the_confirmations_numbers_not_a_mean_with_the_stall(searching):
    """The low end stalled (3,100 ms), then met the SLO measured again (100 ms): its row,
    charts, exports and compare's verdicts read 100 ms over one measurement, as the
    search's verdict does; the stall stays stored and in the search's path."""
    from portal.benchmarks import runview
    from servebench import compare as sc

    run, runner = searching
    spec = rs.parse_spec(run.spec)
    low = rs.search_point(spec, 1)
    assert post(runner, run, "measurements", body(spec, low, 3100.0)).status_code == 201
    assert post(runner, run, "measurements", body(spec, low, 100.0, repeat=1)).status_code == 201
    (point,) = [p for p in runview.load(run).results.points if p.point_key == low.key]
    assert (point.repeats, point.mean["p99_ttft_ms"], point.failed) == (1, 100.0, 0)
    (search,) = ingestion.sla_searches(run)
    assert [s["metrics"]["p99_ttft_ms"] for s in search["path"]] == [3100.0, 100.0]
    document = documents.result_document(run)
    assert len(document["measurements"]) == 2  # both stay in the result document
    (side,) = [p.side for k, p in sc.points_of(document).items() if k[1] == low.key]
    assert [m["p99_ttft_ms"] for m in side.metrics] == [100.0]
    # The aggregates in SQL (history, the verdict's noise series) agree: no spec parsed.
    from portal.benchmarks import history as hist
    from servebench import verdict

    values = hist.run_values([hist.SeriesRun(run.pk, run.public_id, run.created_at)])
    (metrics,) = [v for (_, key), v in values[run.pk].items() if key == low.key]
    assert metrics[verdict.parse_metric("p99_ttft_ms").key] == 100.0
