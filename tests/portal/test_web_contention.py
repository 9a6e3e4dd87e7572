"""The conditions a measurement was taken under: stored from the runner, returned in the
result document, and shown on the run page, where a contended point gets a warning and
the headline speedup is flagged when either side of it was contended."""

from __future__ import annotations

import pytest
from conditionsdata import REASON, conditions, run_with
from django.test import Client

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.benchmarks import documents
from portal.benchmarks.models import Measurement, Run, RunStatus
from runners import result as rr

pytestmark = pytest.mark.django_db


def test_the_runner_api_stores_conditions_and_the_result_document_returns_them(
    make_run, personas, bearer_client, measurement
):
    run = make_run(owner=personas["owner"].user, status=RunStatus.DISPATCHED)
    client = bearer_client(issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run).plaintext)
    url = f"/api/v1/runner/runs/{run.public_id}/measurements"
    with_conditions = measurement(conditions=conditions(True))
    assert client.post(url, with_conditions, content_type="application/json").status_code == 201
    older = measurement(point_key="concurrency:max_concurrency=4")  # a runner before the field
    assert "conditions" not in older
    assert client.post(url, older, content_type="application/json").status_code == 201

    rows = {m.point_key: m for m in Measurement.objects.filter(run=run)}
    assert rows["concurrency:max_concurrency=1"].conditions == conditions(True)
    assert rows["concurrency:max_concurrency=4"].conditions == {}
    doc = documents.measurement_document(rows["concurrency:max_concurrency=1"])
    assert rr.Measurement.model_validate(doc).conditions == conditions(True)

    response = personas["owner"].client.get(f"/api/v1/runs/{run.public_id}/result")
    assert response.status_code == 200
    by_key = {m["point"]["key"]: m for m in response.json()["measurements"]}
    assert by_key["concurrency:max_concurrency=1"]["conditions"]["contended"] is True
    assert by_key["concurrency:max_concurrency=1"]["conditions"]["reasons"] == [REASON]
    assert by_key["concurrency:max_concurrency=4"]["conditions"] == {}


def page(run: Run) -> str:
    client = Client()
    client.force_login(run.owner)
    response = client.get(run.get_absolute_url())
    assert response.status_code == 200
    return response.content.decode()


def test_a_contended_hf_baseline_is_warned_about_and_the_speedup_flagged(make_user):
    html = page(run_with(make_user(), hf_contended=True))
    assert 'id="contention-warning"' in html
    assert "Measured under CPU contention" in html
    assert "hf-sequential baseline" in html
    assert REASON in html
    assert "every speedup over the HF baseline on this page is inflated" in html
    hf_stat = html[html.index('id="hf-stat"') :].split("</div></div>")[0]
    assert "measured under CPU contention" in hf_stat
    speedup = html[html.index('id="speedup-stat"') :].split("</div></div>")[0]
    assert "not trustworthy" in speedup and "the HF baseline" in speedup
    assert "(measured under CPU contention)" in html  # the link preview says it too


def test_a_contended_best_vllm_point_flags_the_speedup_but_not_the_baseline(make_user):
    html = page(run_with(make_user(), hf_contended=False, vllm_contended_at=16))
    assert 'id="contention-warning"' in html
    assert "vllm concurrency:max_concurrency=16" in html
    assert "speedup over the HF baseline on this page is inflated" not in html
    hf_stat = html[html.index('id="hf-stat"') :].split("</div></div>")[0]
    assert "contention" not in hf_stat
    speedup = html[html.index('id="speedup-stat"') :].split("</div></div>")[0]
    assert "not trustworthy" in speedup and "the best vLLM point" in speedup


def test_clean_measurements_show_no_warning(make_user):
    html = page(run_with(make_user(), hf_contended=False))
    assert 'id="contention-warning"' not in html
    assert "not trustworthy" not in html
    assert "measured under CPU contention" not in html.lower()


def test_the_cores_the_server_and_the_client_had_are_said_next_to_the_warning(make_user):
    split = "server 0-6, client 7 (split: 7 physical cores to the server, 1 to the client)"
    html = page(run_with(make_user(), hf_contended=True, core_split=split))
    assert f'<p class="muted" id="core-split">Cores: {split}.</p>' in html
    assert html.index('id="contention-warning"') < html.index('id="core-split"')
    assert "Cores (server, client)" in html  # among the environment's facts too
    assert 'id="core-split"' not in page(run_with(make_user(), hf_contended=False))
