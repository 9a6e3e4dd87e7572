"""Every hostile value into every input surface: a 4xx naming the field, never a 5xx, and
nothing stored.

Values: lone surrogates in keys and in values, NUL, CR and LF, other C0 and C1 controls,
a right-to-left override, 10,000-deep arrays and objects, integers beyond 64 bits (and of
5,000 digits), NaN and Infinity literals, a key given twice, and YAML 1.1 scalars that
JSON and YAML 1.2 read otherwise (``1:30``, ``yes``, ``010``, ``0x10``, ``1_000``).

Surfaces: each API endpoint that takes a body (a run, a baseline mark, the runner's
events and measurements with a run token; JSON, a raw YAML spec, a spec as YAML text in
JSON), every API and page query parameter (values and names), and the new-run form's
fields (the spec text, the hidden ``synced``, the fields that edit the spec), submitted
and through its live check. The class is refused where input enters
(``portal.api.parsers``, ``portal.lib.security``, ``portal.web.forms``), so a new field
or endpoint gets the same answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from django.test import Client

from portal.accounts.models import ApiToken
from portal.accounts.tokens import create_user_token, issue_token
from portal.benchmarks.models import Baseline, Environment, Measurement, Run, RunStatus
from runners import spec as rs
from tests.portal.conftest import measurement_body, tiny_spec

pytestmark = pytest.mark.django_db

JSON = "application/json"
YAML = "application/yaml"
DEEP = 10_000


@dataclass
class World:
    api: Client  # the owner's CI token
    runner: Client  # the running run's token
    browser: Client  # the owner, signed in
    run: Run  # running
    done: Run  # succeeded: a baseline can be marked on it


@pytest.fixture
def world(make_user: Any, make_run: Any, settings: Any) -> World:
    settings.SERVEBENCH_EXECUTOR = "local"
    owner = make_user("hostile-owner")
    run = make_run(owner=owner, status=RunStatus.RUNNING)
    done = make_run(owner=owner, status=RunStatus.SUCCEEDED)
    browser = Client()
    browser.force_login(owner)
    return World(
        api=Client(headers={"Authorization": f"Bearer {create_user_token(owner, 'h').plaintext}"}),
        runner=Client(
            headers={
                "Authorization": "Bearer "
                + issue_token(owner, kind=ApiToken.Kind.RUN, run=run).plaintext
            }
        ),
        browser=browser,
        run=run,
        done=done,
    )


def stored() -> tuple[int, ...]:
    return (
        Run.objects.count(),
        Measurement.objects.count(),
        Baseline.objects.count(),
        Environment.objects.count(),
    )


def refusal(response: Any) -> dict[str, Any]:
    """The API's error of a 4xx (its body must render: that is the first thing refused)."""
    assert 400 <= response.status_code < 500, (response.status_code, response.content[:300])
    return response.json()["error"]


# --------------------------------------------------------------------------- JSON bodies

# (case, one member of a JSON object as raw text, the field it is refused at)
MEMBERS: list[tuple[str, str, str]] = [
    ("lone surrogate in a key", '"k\\ud800": 1', "k\\ud800"),
    ("lone low surrogate in a key", '"\\udc00": 1', "\\udc00"),
    ("lone surrogate in a value", '"note": "a\\udfffb"', "note"),
    ("NUL in a key", '"k\\u0000": 1', "k\\x00"),
    ("NUL in a value", '"note": "a\\u0000"', "note"),
    ("CR in a key", '"k\\r": 1', "k\\x0d"),
    ("LF in a key", '"k\\n": 1', "k\\x0a"),
    ("ESC in a key", '"k\\u001b[2J": 1', "k\\x1b[2J"),
    ("C1 control in a key", '"k\\u0085": 1', "k\\x85"),
    ("RTL override in a key", '"abc\\u202edef": 1', "abc\\u202edef"),
    # Deep values: named down to the level where they pass MAX_JSON_DEPTH ("...").
    ("10,000-deep array", '"note": ' + "[" * DEEP + "]" * DEEP, "note.0.0..."),
    ("10,000-deep object", '"note": ' + '{"a": ' * DEEP + "1" + "}" * DEEP, "note.a.a..."),
    ("40-deep array", '"note": ' + "[" * 40 + "]" * 40, "note.0.0..."),
    ("an integer beyond 64 bits", f'"note": {2**70}', "note"),
    ("a 5,000-digit integer", '"note": ' + "9" * 5000, "note"),
    ("a NaN literal", '"note": NaN', "note"),
    ("an Infinity literal", '"note": [1, Infinity]', "note.1"),
    ("a -Infinity literal", '"note": {"x": -Infinity}', "note.x"),
    ("a number beyond floats", '"note": 1e400', "note"),
    ("a key given twice", '"note": 1, "note": 2', "note"),
]

BodySurface = Callable[[World, str], tuple[Client, str, str, str]]


def _run_spec(w: World, member: str) -> tuple[Client, str, str, str]:
    body = '{"spec": {"model": {"id": "org/m"}, @}}'.replace("@", member)
    return w.api, "/api/v1/runs/", body, "spec."


def _run_body(w: World, member: str) -> tuple[Client, str, str, str]:
    return w.api, "/api/v1/runs/", '{"preset": "seed", @}'.replace("@", member), ""


def _baseline(w: World, member: str) -> tuple[Client, str, str, str]:
    path = f"/api/v1/runs/{w.done.public_id}/baseline"
    return w.api, path, '{"label": "main", @}'.replace("@", member), ""


def _event(w: World, member: str) -> tuple[Client, str, str, str]:
    path = f"/api/v1/runner/runs/{w.run.public_id}/events"
    body = '{"type": "environment", "fingerprint": "ab", "environment": {@}}'
    body = body.replace("@", member)
    return w.runner, path, body, "environment."


def _measurement(w: World, member: str) -> tuple[Client, str, str, str]:
    path = f"/api/v1/runner/runs/{w.run.public_id}/measurements"
    body = json.dumps(measurement_body(raw={"completed": 8}))
    return w.runner, path, body.replace('"raw": {', '"raw": {' + member + ", "), "raw."


BODY_SURFACES: dict[str, BodySurface] = {
    "POST runs (in the spec)": _run_spec,
    "POST runs (the body)": _run_body,
    "POST a baseline mark": _baseline,
    "runner event": _event,
    "runner measurement": _measurement,
}


@pytest.mark.parametrize("surface", BODY_SURFACES, ids=list(BODY_SURFACES))
@pytest.mark.parametrize(("case", "member", "field"), MEMBERS, ids=[m[0] for m in MEMBERS])
def test_a_hostile_json_value_is_refused_at_its_field(
    world: World, surface: str, case: str, member: str, field: str
) -> None:
    client, path, body, prefix = BODY_SURFACES[surface](world, member)
    before = stored()
    response = client.post(path, body, content_type=JSON)
    error = refusal(response)
    assert response.status_code == 400 and error["code"] == "malformed_body", (case, error)
    if field.endswith("..."):
        assert error["field"].startswith(prefix + field.removesuffix("...")), (case, error)
        assert error["field"].count(".") + 1 == rs.MAX_JSON_DEPTH, (case, error)
    else:
        assert error["field"] == prefix + field, (case, error)
    assert error["message"].startswith(error["field"] + ": "), error
    assert stored() == before


# --------------------------------------------------------------------------- YAML specs

TINY_YAML = yaml.safe_dump(tiny_spec(), sort_keys=False)

# (case, a line appended to the tiny spec's workload mapping or the whole spec, field)
YAML_CASES: list[tuple[str, str, str | None]] = [
    ("YAML 1.1 base-60 (1:30 was 90)", "workload: {input_len: 1:30}", "spec.workload.input_len"),
    ("YAML 1.1 yes", "workload: {ignore_eos: yes}", "spec.workload.ignore_eos"),
    ("YAML 1.1 off", "workload: {ignore_eos: off}", "spec.workload.ignore_eos"),
    ("YAML 1.1 octal 010 (was 8)", "workload: {seed: 010}", "spec.workload.seed"),
    ("a hexadecimal 0x10", "workload: {seed: 0x10}", "spec.workload.seed"),
    ("digits grouped 1_000", "workload: {num_prompts: 1_000}", "spec.workload.num_prompts"),
    ("an explicit !!int 010", "workload: {seed: !!int 010}", "spec.workload.seed"),
    ("a key given twice", "workload: {input_len: 64, input_len: 128}", "spec.workload.input_len"),
    ("a section given twice", "repeats: 1\nrepeats: 2", "spec.repeats"),
    ("a lone surrogate in a key", '"k\\ud800": 1', "spec.k\\ud800"),
    ("a lone surrogate in a value", 'description: "\\ud800"', "spec.description"),
    ("a control character in a key", '"k\\e": 1', "spec.k\\x1b"),
    ("an RTL override in a key", '"k\\u202e": 1', "spec.k\\u202e"),
    ("YAML .nan", "workload: {request_rate: .nan}", "spec.workload.request_rate"),
    ("a 5,000-digit integer", "workload: {seed: " + "9" * 5000 + "}", "spec.workload.seed"),
    ("a date (not a JSON type)", "description: !!timestamp 2026-01-31", "spec.description"),
    ("10,000-deep flow sequence", "note: " + "[" * DEEP + "]" * DEEP, None),
]


def _yaml_spec(extra: str) -> str:
    lines = [
        line for line in TINY_YAML.splitlines() if not line.startswith(extra.split(":")[0] + ":")
    ]
    return "\n".join([*lines, extra]) + "\n"


@pytest.mark.parametrize(("case", "extra", "field"), YAML_CASES, ids=[c[0] for c in YAML_CASES])
@pytest.mark.parametrize("how", ["a raw YAML body", "YAML text in a JSON body"])
def test_yaml_that_json_would_read_otherwise_is_refused_at_its_field(
    world: World, case: str, extra: str, field: str | None, how: str
) -> None:
    text = _yaml_spec(extra)
    before = stored()
    if how == "a raw YAML body":
        response = world.api.post("/api/v1/runs/", text, content_type=YAML)
    else:
        response = world.api.post("/api/v1/runs/", json.dumps({"spec": text}), content_type=JSON)
    error = refusal(response)
    assert response.status_code == 400, (case, error)
    assert error.get("field") == field, (case, error)
    assert stored() == before


def test_the_refusals_say_what_to_write_instead(world: World) -> None:
    response = world.api.post("/api/v1/runs/", _yaml_spec("workload: {input_len: 1:30}"), YAML)
    message = refusal(response)["message"]
    assert "90 in YAML 1.1" in message and "write 90" in message and "quote it" in message
    twice = refusal(world.api.post("/api/v1/runs/", "a: 1\nb: 2\na: 3\n", YAML))["message"]
    assert "given twice (lines 1 and 3)" in twice
    # ... and a JSON spec read by the YAML reader keeps JSON's numbers.
    spec = tiny_spec(workload={**tiny_spec()["workload"], "burstiness": 1.5e0})
    text = json.dumps(spec).replace("1.5", "15e-1")
    ok = world.api.post("/api/v1/runs/", text, content_type=YAML)
    assert ok.status_code == 201, ok.content[:300]


# --------------------------------------------------------------------------- numbers

# (case, endpoint, body changes, field): numbers the runner's models refuse
NUMBERS: list[tuple[str, str, dict[str, Any], str]] = [
    ("negative peak GPU memory", "measurements", {"gpu_memory_peak_bytes": -1},
     "gpu_memory_peak_bytes"),
    ("negative throughput", "measurements", {"metrics": {"output_throughput": -5.0}},
     "metrics.output_throughput"),
    ("negative duration", "measurements", {"duration_s": -0.5}, "duration_s"),
    ("negative preemptions", "measurements", {"server_metrics": {"preemptions": -1}},
     "server_metrics.preemptions"),
    ("KV cache usage above 1", "measurements", {"server_metrics": {"kv_cache_usage_peak": 1.5}},
     "server_metrics.kv_cache_usage_peak"),
    ("negative input length", "measurements", {"point": {**measurement_body()["point"],
     "input_len": -1}}, "point.input_len"),
    ("negative repeat", "measurements", {"repeat": -1}, "repeat"),
    ("negative progress", "events", {"type": "progress", "done": -1}, "done"),
    ("a fingerprint with a newline", "events", {"type": "environment", "environment": {},
     "fingerprint": "abc\n"}, "fingerprint"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "endpoint", "changes", "field"), NUMBERS,
                         ids=[n[0] for n in NUMBERS])  # fmt: skip
def test_a_number_that_cannot_be_is_refused_at_its_field(
    world: World, case: str, endpoint: str, changes: dict[str, Any], field: str
) -> None:
    body = measurement_body(**changes) if endpoint == "measurements" else changes
    path = f"/api/v1/runner/runs/{world.run.public_id}/{endpoint}"
    before = stored()
    error = refusal(world.runner.post(path, json.dumps(body), content_type=JSON))
    assert error["field"] == field, (case, error)
    assert stored() == before


# --------------------------------------------------------------------------- query params

CONTROLS = {
    "CR": "%0D",
    "LF": "%0A",
    "TAB": "%09",
    "NUL": "%00",
    "ESC": "%1B",
    "DEL": "%7F",
    "C1 NEL": "%C2%85",
    "RTL override": "%E2%80%AE",
}
# (surface, path with {v} where the hostile value goes, the parameter)
QUERY_SURFACES = [
    ("runs list", "/api/v1/runs/?model=org/m{v}", "model"),
    ("runs list owner", "/api/v1/runs/?owner=me{v}", "owner"),
    ("runs list page", "/api/v1/runs/?page=1{v}", "page"),
    ("baselines", "/api/v1/baselines/?label=main{v}", "label"),
    ("resolve", "/api/v1/runs/resolve?ref=latest:main{v}", "ref"),
    ("compare", "/api/v1/compare/?runs={run}{v}", "runs"),
    ("history", "/api/v1/history/?fingerprint=abcdef12{v}", "fingerprint"),
    ("logs", "/api/v1/runs/{run}/logs?tail=10{v}", "tail"),
    ("result download", "/api/v1/runs/{run}/result?download=1{v}", "download"),
    ("run list page", "/runs/?gpu=H100{v}", "gpu"),
    ("compare page", "/compare/?runs={run}{v}", "runs"),
    ("history page", "/history/abcdef12/?metric=output_throughput{v}", "metric"),
    ("new run page", "/runs/new/?preset=seed{v}", "preset"),
    ("home page", "/?q={v}", "q"),
]


@pytest.mark.parametrize("control", CONTROLS, ids=list(CONTROLS))
@pytest.mark.parametrize(("surface", "path", "param"), QUERY_SURFACES,
                         ids=[q[0] for q in QUERY_SURFACES])  # fmt: skip
def test_a_control_character_in_a_query_parameter_is_refused_naming_it(
    world: World, surface: str, path: str, param: str, control: str
) -> None:
    url = path.format(v=CONTROLS[control], run=world.run.public_id)
    response = (world.api if url.startswith("/api/") else world.browser).get(url)
    assert response.status_code == 400, (surface, control, response.status_code)
    if url.startswith("/api/"):
        assert refusal(response)["field"] == param
    else:
        assert repr(param) in response.content.decode()


def test_a_control_character_in_a_parameter_name_is_refused_naming_it(world: World) -> None:
    error = refusal(world.api.get("/api/v1/runs/?mo%0Ddel=x"))
    assert error["field"] == "mo\\x0ddel"
    assert world.browser.get("/runs/?g%1Bpu=x").status_code == 400


@pytest.mark.parametrize(("param", "value"), [("name", "a%0Db"), ("is_public", "true%0A")])
def test_create_parameters_are_refused_with_a_control_character(
    world: World, param: str, value: str
) -> None:
    before = stored()
    body = json.dumps({"spec": tiny_spec()})
    response = world.api.post(f"/api/v1/runs/?{param}={value}", body, content_type=JSON)
    assert refusal(response)["field"] == param
    assert stored() == before


# --------------------------------------------------------------------------- the web form

FORM = "/runs/new/"
CHECK = "/runs/new/check"


def _form(w: World) -> dict[str, Any]:
    """What a browser posts for the form as it rendered the tiny demo preset."""
    response = w.browser.get(FORM + f"?preset={rs.TINY_DEMO}")
    data = {k: v for k, v in response.context["form"].initial.items() if v is not None}
    return {k: v for k, v in data.items() if k != "is_public"}


def _spec_text(extra: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def change(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "spec_text": data["spec_text"] + extra + "\n"}

    return change


def _set(field: str, value: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda data: {**data, field: value}


# (case, change to the posted form, the form field refused, text its message holds)
FORM_CASES: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]], str, str]] = [
    ("a lone surrogate in a key", _spec_text('"k\\ud800": 1'), "spec_text", "k\\ud800"),
    ("a lone surrogate in the name", _spec_text('description: "\\udfff"'), "spec_text",
     "spec.description"),
    ("a control character in a key", _spec_text('"k\\e": 1'), "spec_text", "k\\x1b"),
    ("a key given twice", _spec_text("repeats: 1\nrepeats: 2"), "spec_text", "given twice"),
    ("YAML 1.1 base-60 prompt length", _set("spec_text", "model: {id: org/m}\n"
     "workload: {input_len: 1:30}\n"), "input_len", "write 90"),
    ("YAML 1.1 yes", _spec_text("description: yes"), "spec_text", "write true"),
    ("YAML 1.1 octal", _set("spec_text", "model: {id: org/m}\nrepeats: 010\n"), "spec_text",
     "leading zero"),
    ("10,000-deep spec text", _set("spec_text", "[" * DEEP + "]" * DEEP), "spec_text",
     "not valid YAML"),
    ("a 5,000-digit integer", _set("spec_text", "model: {id: org/m}\nrepeats: "
     + "9" * 5000 + "\n"), "spec_text", "64 bits"),
    ("10,000-deep synced", _set("synced", "[" * DEEP + "]" * DEEP), "synced", "nested"),
    ("a lone surrogate in synced", _set("synced", '{"fields": {"k\\ud800": 1}}'), "synced",
     "k\\ud800"),
    ("a CR in the name", _set("name", "a\rb"), "name", "control characters"),
    ("a newline ending the model id", _set("spec_text", 'model: {id: "org/m\\n"}\n'),
     "model_id", "not allowed"),
    ("a newline inside the concurrency sweep", _set("concurrency", "1\n,4"), "concurrency",
     "not a positive whole number"),
    ("a prompt length beyond 64 bits", _set("input_len", "9" * 30), "input_len", "64 bits"),
]  # fmt: skip


@pytest.mark.parametrize("endpoint", [FORM, CHECK])
@pytest.mark.parametrize(("case", "change", "field", "text"), FORM_CASES,
                         ids=[c[0] for c in FORM_CASES])  # fmt: skip
def test_a_hostile_form_value_is_an_error_at_its_field(
    world: World, case: str, change: Any, field: str, text: str, endpoint: str
) -> None:
    data = change(_form(world))
    before = stored()
    response = world.browser.post(endpoint, data)
    # A form re-renders (200) with every problem at its field, as Django forms do; its
    # live check answers the same problems as JSON.
    assert response.status_code == 200, (case, response.status_code)
    if endpoint == CHECK:
        errors = [e for e in response.json()["errors"] if e["field"] == field]
    else:
        response.content.decode()  # it renders
        form = response.context["form"]
        errors = [{"message": m} for m in form.errors.get(field, [])]
    assert errors, (case, response.content[:800])
    assert any(text in e["message"] or text in e.get("path", "") for e in errors), (case, errors)
    assert stored() == before


@pytest.mark.parametrize(
    ("field", "value"), [("spec_text", "model: {id: org/m}\0"), ("name", "abc\u202edef")]
)
def test_a_form_field_with_nul_or_an_override_is_refused_naming_it(
    world: World, field: str, value: str
) -> None:
    before = stored()
    response = world.browser.post(FORM, {**_form(world), field: value})
    assert response.status_code == 400 and repr(field) in response.content.decode()
    assert stored() == before


# --------------------------------------------------------------------------- what works


def test_query_parameters_apply_to_json_and_yaml_bodies_alike(world: World) -> None:
    body = yaml.safe_dump(tiny_spec())
    from_yaml = world.api.post("/api/v1/runs/?is_public=true&name=nightly", body, YAML)
    assert from_yaml.status_code == 201, from_yaml.content[:300]
    assert from_yaml.json()["is_public"] is True and from_yaml.json()["name"] == "nightly"
    as_json = json.dumps({"spec": tiny_spec()})
    from_json = world.api.post("/api/v1/runs/?is_public=1&name=nightly", as_json, JSON)
    assert from_json.status_code == 201, from_json.content[:300]
    assert from_json.json()["is_public"] is True and from_json.json()["name"] == "nightly"
    both = json.dumps({"spec": tiny_spec(), "is_public": False})
    conflict = refusal(world.api.post("/api/v1/runs/?is_public=true", both, JSON))
    assert (
        conflict["field"] == "is_public" and "in the query and in the body" in (conflict["message"])
    )
    bad = refusal(world.api.post("/api/v1/runs/?is_public=maybe", body, YAML))
    assert bad["field"] == "is_public"
    twice = refusal(world.api.post("/api/v1/runs/?name=a&name=b", body, YAML))
    assert twice["field"] == "name"
    named = json.dumps({"spec": tiny_spec(), "name": "a\u202eb"})
    rtl = refusal(world.api.post("/api/v1/runs/", named, JSON))
    assert rtl["field"] == "name"


def test_the_schema_shows_paginated_lists_as_they_are_answered(world: World) -> None:
    schema = world.api.get("/api/v1/schema/?format=json").json()
    lists = ("/api/v1/runs/", "/api/v1/labels/", "/api/v1/baselines/")
    for path, operation in ((p, "get") for p in lists):
        op = schema["paths"][path][operation]
        ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        envelope = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert set(envelope["properties"]) == {"count", "next", "previous", "results"}
        assert envelope["properties"]["results"]["type"] == "array"
        assert {"page", "page_size"} <= {p["name"] for p in op["parameters"]}
    listed = world.api.get("/api/v1/runs/").json()
    assert set(listed) == {"count", "next", "previous", "results"}
