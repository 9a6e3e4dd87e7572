"""REST API: runs. Every test walks the personas: owner, another user, anonymous."""

from __future__ import annotations

import pytest
import yaml
from django.test import Client

from portal.benchmarks.models import Run, RunStatus
from runners.result import ResultDocument

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs/"


def _error(response) -> dict:
    body = response.json()
    assert set(body) >= {"error"}, body
    assert body["error"]["code"] and body["error"]["message"]
    return body["error"]


# --------------------------------------------------------------------------- create


def test_signed_in_users_create_runs_and_anonymous_gets_401(personas, spec_dict):
    for who in ("owner", "other"):
        response = personas[who].client.post(
            RUNS, {"spec": spec_dict(), "name": f"by {who}"}, content_type="application/json"
        )
        assert response.status_code == 201, response.content
        body = response.json()
        assert body["owner"] == personas[who].user.username
        assert body["status"] == "queued"
        assert body["progress"] == {"done": 0, "total": 3}  # HF baseline, vLLM at 1 and 4
        assert response["Location"].endswith(f"/api/v1/runs/{body['id']}/")
    response = personas["anon"].client.post(
        RUNS, {"spec": spec_dict()}, content_type="application/json"
    )
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert "Bearer sb_ci_" in _error(response)["message"]
    assert Run.objects.count() == 2


def test_create_from_a_preset(personas, settings):
    settings.SERVEBENCH_LOCAL_GPUS = 1  # the seed asks for a GPU (preflight refuses it without)
    response = personas["owner"].client.post(
        RUNS, {"preset": "seed"}, content_type="application/json"
    )
    assert response.status_code == 201
    assert response.json()["model_id"] == "Qwen/Qwen3-0.6B"
    assert (
        personas["anon"]
        .client.post(RUNS, {"preset": "seed"}, content_type="application/json")
        .status_code
        == 401
    )


def test_create_from_a_raw_yaml_body(personas, spec_dict):
    body = yaml.safe_dump(spec_dict())
    response = personas["owner"].client.post(
        RUNS + "?name=from-yaml", body, content_type="application/yaml"
    )
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "from-yaml"
    assert (
        personas["anon"].client.post(RUNS, body, content_type="application/yaml").status_code == 401
    )


def test_session_auth_needs_the_csrf_token(personas, spec_dict):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(personas["owner"].user)
    response = browser.post(RUNS, {"spec": spec_dict()}, content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in _error(response)["message"]
    browser.get("/api/v1/presets/")  # any page; the CSRF cookie is set on login pages
    from django.middleware.csrf import _get_new_csrf_string

    token = _get_new_csrf_string()
    browser.cookies["csrftoken"] = token
    response = browser.post(
        RUNS, {"spec": spec_dict()}, content_type="application/json", headers={"X-CSRFToken": token}
    )
    assert response.status_code == 201
    assert Run.objects.get().owner == personas["owner"].user


def test_a_run_token_is_not_an_api_token(personas, make_run, bearer_client):
    from portal.accounts.models import ApiToken
    from portal.accounts.tokens import issue_token

    run = make_run(owner=personas["owner"].user)
    runner = bearer_client(issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run).plaintext)
    assert runner.get(f"{RUNS}{run.public_id}/").status_code == 401
    assert runner.post(RUNS, {"preset": "seed"}, content_type="application/json").status_code == 401
    assert bearer_client("sb_ci_nonsense-token-value").get(RUNS).status_code == 401


# --------------------------------------------------------------------------- read


def test_private_runs_are_visible_to_their_owner_only(personas, make_run):
    run = make_run(owner=personas["owner"].user)
    detail = f"{RUNS}{run.public_id}/"
    assert personas["owner"].client.get(detail).status_code == 200
    for who in ("other", "anon"):
        response = personas[who].client.get(detail)
        assert response.status_code == 404  # not 403: existence does not leak
        assert _error(response)["code"] == "not_found"
        assert personas[who].client.get(detail + "result").status_code == 404
        assert personas[who].client.get(detail + "spec").status_code == 404
        assert personas[who].client.get(RUNS).json()["count"] == 0
    assert personas["owner"].client.get(RUNS).json()["count"] == 1


def test_public_runs_are_readable_by_everyone(personas, make_run):
    run = make_run(owner=personas["owner"].user, is_public=True)
    for who in ("owner", "other", "anon"):
        client = personas[who].client
        assert client.get(f"{RUNS}{run.public_id}/").status_code == 200
        assert client.get(f"{RUNS}{run.public_id}/result").status_code == 200
        assert [r["id"] for r in client.get(RUNS).json()["results"]] == [run.public_id]


def test_detail_has_measurements_and_environment(personas, make_run, measurement):
    from portal.benchmarks import environment, ingestion
    from runners.result import Measurement

    run = make_run(owner=personas["owner"].user, status=RunStatus.RUNNING)
    ingestion.ingest_measurement(run, Measurement.model_validate(measurement()))
    environment.store_environment(
        run, {"gpu": {"model": "NVIDIA H100", "count": 1}, "software": {"vllm": "0.32.0"}}, "f" * 64
    )
    body = personas["owner"].client.get(f"{RUNS}{run.public_id}/").json()
    assert body["measurements"][0]["output_throughput"] == 56.0
    assert body["measurements"][0]["p50_ttft_ms"] == 11.0
    assert "detail" not in body["measurements"][0]  # per-request arrays: result document
    assert body["environment"]["gpu_name"] == "NVIDIA H100"
    assert body["environment"]["vllm_version"] == "0.32.0"
    assert body["gpu_name"] == "NVIDIA H100"
    assert body["spec"]["model"]["id"] == "org/tiny-model"
    for who in ("other", "anon"):
        assert personas[who].client.get(f"{RUNS}{run.public_id}/").status_code == 404


def test_result_document_matches_the_runner_contract(personas, make_run, measurement):
    from portal.benchmarks import ingestion
    from runners.result import Measurement

    run = make_run(owner=personas["owner"].user, status=RunStatus.RUNNING)
    sent = Measurement.model_validate(measurement())
    ingestion.ingest_measurement(run, sent)
    response = personas["owner"].client.get(f"{RUNS}{run.public_id}/result?download=1")
    assert response.status_code == 200
    assert "attachment" in response["Content-Disposition"]
    doc = ResultDocument.model_validate(response.json())
    assert doc.measurements[0] == sent  # stored and served back exactly
    for who in ("other", "anon"):
        assert personas[who].client.get(f"{RUNS}{run.public_id}/result").status_code == 404


def test_spec_download_as_yaml_or_json(personas, make_run):
    run = make_run(owner=personas["owner"].user)
    as_yaml = personas["owner"].client.get(f"{RUNS}{run.public_id}/spec")
    assert as_yaml.status_code == 200
    assert as_yaml["Content-Type"].startswith("application/yaml")
    assert yaml.safe_load(as_yaml.content)["model"]["id"] == "org/tiny-model"
    as_json = personas["owner"].client.get(f"{RUNS}{run.public_id}/spec?format=json")
    assert as_json.json()["model"]["id"] == "org/tiny-model"
    for who in ("other", "anon"):
        assert personas[who].client.get(f"{RUNS}{run.public_id}/spec").status_code == 404


# --------------------------------------------------------------------------- list


def test_list_filters_and_paginates(personas, make_run, spec_dict):
    owner = personas["owner"].user
    other = personas["other"].user
    a = make_run(owner=owner, spec=spec_dict(model={"id": "org/a"}), gpu_name="H100")
    b = make_run(owner=owner, spec=spec_dict(backends=[{"kind": "vllm"}]), status="failed")
    c = make_run(owner=other, is_public=True, gpu_name="L4")
    client = personas["owner"].client

    def ids(query: str) -> list[str]:
        response = client.get(RUNS + query)
        assert response.status_code == 200, response.content
        return [r["id"] for r in response.json()["results"]]

    assert ids("") == [c.public_id, b.public_id, a.public_id]  # newest first
    assert ids("?model=org/a") == [a.public_id]
    assert ids("?gpu=L4") == [c.public_id]
    assert ids("?backend=hf-sequential") == [c.public_id, a.public_id]
    assert ids("?status=failed") == [b.public_id]
    assert ids("?owner=me") == [b.public_id, a.public_id]
    assert ids("?owner=other") == [c.public_id]
    page = client.get(RUNS + "?page_size=2").json()
    assert page["count"] == 3 and len(page["results"]) == 2 and page["next"]
    assert personas["other"].client.get(RUNS + "?owner=me").json()["count"] == 1
    assert personas["anon"].client.get(RUNS + "?owner=me").json()["count"] == 0
    assert personas["anon"].client.get(RUNS).json()["count"] == 1


def test_the_count_is_the_lists_length_for_every_reader_and_filter(
    personas, make_run, make_user, spec_dict
):
    """``queries.count_runs`` counts the visibility rule as two halves (public, and the
    reader's private runs): for staff, an owner, another user, an inactive user and an
    anonymous reader, under each filter, it is the length of ``run_list``, which reads
    the rule as one OR, and the API's ``count`` is that number."""
    from django.contrib.auth.models import AnonymousUser

    from portal.benchmarks import queries

    owner, other = personas["owner"].user, personas["other"].user
    staff = make_user("staff", is_staff=True)
    gone = make_user("gone")
    vllm = spec_dict(backends=[{"kind": "vllm"}])
    make_run(owner=owner)
    make_run(owner=owner, is_public=True, gpu_name="L4")
    make_run(owner=owner, spec=vllm, status="failed")
    make_run(owner=other, is_public=True, spec=vllm)
    make_run(owner=other, status="succeeded")
    make_run(owner=gone)
    make_run(owner=gone, is_public=True, status="succeeded")
    type(gone).objects.filter(pk=gone.pk).update(is_active=False)
    gone.refresh_from_db()
    readers = {"staff": staff, "owner": owner, "other": other, "gone": gone}
    readers["anon"] = AnonymousUser()
    filters = [
        {},
        {"status": "succeeded"},
        {"backend": "vllm"},
        {"gpu": "L4"},
        {"owner": "me"},
        {"owner": "other"},
        {"model": "no/such-model"},
    ]
    counted = set()
    for who, user in readers.items():
        for params in filters:
            chosen = queries.RunFilters.from_params(params)
            listed = len(queries.run_list(user, chosen))
            assert queries.count_runs(user, chosen) == listed, (who, params)
            counted.add(listed)
    assert counted >= {0, 1, 2, 3, 4, 7}  # the readers see different things
    for who in ("owner", "other", "anon"):
        answer = personas[who].client.get(RUNS).json()
        assert answer["count"] == len(queries.run_list(personas[who].user or AnonymousUser()))


def test_an_unknown_status_filter_is_a_400_naming_the_parameter(personas):
    for who in ("owner", "other", "anon"):
        response = personas[who].client.get(RUNS + "?status=done")
        assert response.status_code == 400
        assert _error(response)["field"] == "status"


def test_the_list_query_count_does_not_grow_with_runs(
    personas, make_run, django_assert_max_num_queries
):
    for _ in range(6):
        make_run(owner=personas["owner"].user)
    # token, last_used, the count (public runs, then the reader's private ones:
    # queries.count_runs), the page (owner joined)
    with django_assert_max_num_queries(5):
        assert personas["owner"].client.get(RUNS).json()["count"] == 6


# --------------------------------------------------------------------------- cancel


def test_only_the_owner_cancels(personas, make_run, django_capture_on_commit_callbacks):
    private = make_run(owner=personas["owner"].user)
    public = make_run(owner=personas["owner"].user, is_public=True)
    assert personas["anon"].client.post(f"{RUNS}{private.public_id}/cancel").status_code == 401
    assert personas["other"].client.post(f"{RUNS}{private.public_id}/cancel").status_code == 404
    response = personas["other"].client.post(f"{RUNS}{public.public_id}/cancel")
    assert response.status_code == 403  # it can see the run, so 403 leaks nothing
    assert Run.objects.filter(status=RunStatus.CANCELLED).count() == 0
    with django_capture_on_commit_callbacks() as callbacks:
        response = personas["owner"].client.post(f"{RUNS}{private.public_id}/cancel")
    assert response.status_code == 202
    assert response.json()["status"] == "cancelled"
    assert len(callbacks) == 1  # the executor stop task
    again = personas["owner"].client.post(f"{RUNS}{private.public_id}/cancel")
    assert again.status_code == 409
    assert again.json()["run_status"] == "cancelled"


# --------------------------------------------------------------------------- misc


def test_presets_and_spec_schema_are_public(personas):
    for who in ("owner", "other", "anon"):
        presets = personas[who].client.get("/api/v1/presets/").json()
        assert [p["name"] for p in presets] == ["seed", "seed-all-baselines"]
        assert presets[0]["spec"]["model"]["id"] == "Qwen/Qwen3-0.6B"
        schema = personas[who].client.get("/api/v1/spec-schema/").json()
        assert schema["title"] == "Spec" and "model" in schema["properties"]


def test_openapi_schema_and_docs_are_served_locally(personas):
    client = personas["anon"].client
    schema = client.get("/api/v1/schema/?format=json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/v1/runs/" in paths and "/api/v1/runs/{public_id}/cancel" in paths
    docs = client.get("/api/v1/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "swagger-ui" in html
    assert "cdn" not in html.lower() and "https://" not in html  # assets from our static files


def test_unknown_api_paths_answer_json(personas):
    response = personas["anon"].client.get("/api/v1/nothing-here")
    assert response.status_code == 404
    assert _error(response)["code"] == "not_found"


def test_the_fast_list_rows_match_the_documented_serializer(personas, make_run):
    import json as _json

    from rest_framework.renderers import JSONRenderer
    from rest_framework.test import APIRequestFactory

    from portal.api.serializers import RunSerializer, run_summaries

    run = make_run(owner=personas["owner"].user, gpu_name="L4", started_at="2026-11-30T06:00Z")
    run = Run.objects.select_related("owner").get(pk=run.pk)
    request = APIRequestFactory().get("/api/v1/runs/")
    fast = _json.loads(JSONRenderer().render(run_summaries([run], request)))
    documented = _json.loads(
        JSONRenderer().render(RunSerializer([run], many=True, context={"request": request}).data)
    )
    assert fast == documented


def test_filter_choices_are_what_the_user_can_see_and_cached(
    personas, make_run, spec_dict, django_assert_num_queries
):
    from portal.benchmarks.queries import filter_choices

    make_run(owner=personas["owner"].user, spec=spec_dict(model={"id": "org/mine"}), gpu_name="L4")
    make_run(owner=personas["other"].user, spec=spec_dict(model={"id": "org/hidden"}))
    make_run(owner=personas["other"].user, is_public=True, gpu_name="H100")
    choices = filter_choices(personas["owner"].user)
    assert choices["model"] == ["org/mine", "org/tiny-model"]
    assert choices["gpu"] == ["H100", "L4"]
    assert choices["backend"] == ["hf-sequential", "vllm"]
    with django_assert_num_queries(0):
        assert filter_choices(personas["owner"].user) == choices
    from django.contrib.auth.models import AnonymousUser

    assert filter_choices(AnonymousUser())["model"] == ["org/tiny-model"]


def test_a_spec_reads_back_with_whole_numbers_as_integers(personas, spec_dict):
    # Stored as the model dumps it (a sweep's values are floats); shown as it was written.
    owner = personas["owner"].client
    created = owner.post(RUNS, {"spec": spec_dict()}, content_type="application/json").json()
    detail = owner.get(f"{RUNS}{created['id']}/").json()
    values = detail["spec"]["sweeps"][0]["values"]
    assert values and all(type(v) is int for v in values), values
    as_json = owner.get(f"{RUNS}{created['id']}/spec?format=json").json()
    assert as_json["sweeps"][0]["values"] == values
    as_yaml = owner.get(f"{RUNS}{created['id']}/spec").content.decode()
    assert f"- {values[0]}\n" in as_yaml and ".0\n" not in as_yaml
