"""Bad input to POST /api/v1/runs/: 400 naming the field, nothing stored, nothing queued."""

from __future__ import annotations

import json

import pytest

from portal.benchmarks.models import Run

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs/"


def _with(path: str, value):
    """A body builder: the tiny spec with the dotted ``path`` set to ``value``."""

    def build(tiny_spec):
        spec = tiny_spec()
        node = spec
        *parents, last = path.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
        return {"spec": spec}

    return build


def _body(body):
    return lambda tiny_spec: body


INVALID_SPECS = [
    # (case, body, field named in the error)
    ("negative input length", _with("workload.input_len", -1), "spec.workload.input_len"),
    ("zero output length", _with("workload.output_len", 0), "spec.workload.output_len"),
    ("string for an int", _with("workload.num_prompts", "many"), "spec.workload.num_prompts"),
    ("float for an int", _with("workload.num_prompts", 2.5), "spec.workload.num_prompts"),
    ("bool for a list", _with("sweeps", True), "spec.sweeps"),
    ("unknown top-level field", _with("colour", "blue"), "spec.colour"),
    ("unknown nested field", _with("workload.promt_len", 5), "spec.workload.promt_len"),
    ("shell metacharacters in model id", _with("model.id", "org/m; rm -rf /"), "spec.model.id"),
    ("command substitution in model id", _with("model.id", "$(curl x)"), "spec.model.id"),
    ("backticks in revision", _with("model.revision", "`id`"), "spec.model.revision"),
    ("path traversal in model id", _with("model.id", "../../etc/passwd"), "spec.model.id"),
    ("huge sweep list", _with("sweeps.0.values", list(range(1, 10_001))), "spec.sweeps.0.values"),
    (
        "too many backends",
        _with("backends", [{"kind": "vllm", "name": f"v{i}"} for i in range(50)]),
        "spec.backends",
    ),
    ("unknown backend kind", _with("backends", [{"kind": "tgi"}]), "spec.backends.0.kind"),
    (
        "shell in vllm extra args",
        _with("backends", [{"kind": "vllm", "extra_args": ["--x;reboot"]}]),
        "spec.backends.0.extra_args.0",
    ),
    (
        "port override in extra args",
        _with("backends", [{"kind": "vllm", "extra_args": ["--port=1"]}]),
        "spec.backends.0.extra_args.0",
    ),
    ("non-integer concurrency", _with("sweeps.0.values", [1.5]), "spec.sweeps.0.values"),
    ("lengths beyond the context", _with("workload.input_len", 100_000), "spec.sweeps.0.values"),
    ("zero timeout", _with("resources.timeout_minutes", 0), "spec.resources.timeout_minutes"),
    ("spec is a list", _body({"spec": [1, 2]}), "spec"),
    ("spec is a number", _body({"spec": 7}), "spec"),
    ("spec and preset", lambda t: {"spec": t(), "preset": "seed"}, "spec"),
    ("neither spec nor preset", _body({"name": "x"}), "spec"),
    ("unknown preset", _body({"preset": "warp-speed"}), "preset"),
    ("unknown body field", _body({"preset": "seed", "priority": 1}), "priority"),
    ("name of the wrong type", _body({"preset": "seed", "name": ["a"]}), "name"),
    ("overlong name", _body({"preset": "seed", "name": "n" * 201}), "name"),
    ("is_public not a bool", _body({"preset": "seed", "is_public": "yes"}), "is_public"),
    (
        "yaml text spec with an error",
        _body({"spec": "model: {id: ok/m}\nrepeats: -1\n"}),
        "spec.repeats",
    ),
]


@pytest.mark.parametrize(
    ("build", "field"), [c[1:] for c in INVALID_SPECS], ids=[c[0] for c in INVALID_SPECS]
)
def test_it_rejects_an_invalid_spec_naming_the_field(
    personas, spec_dict, build, field, django_capture_on_commit_callbacks
):
    body = build(spec_dict)
    with django_capture_on_commit_callbacks() as callbacks:
        response = personas["owner"].client.post(RUNS, body, content_type="application/json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_spec"
    assert error["field"] == field, error
    assert error["fields"][0]["field"] == field
    assert error["message"]
    assert Run.objects.count() == 0
    assert callbacks == []  # nothing queued


MALFORMED = [
    # (case, raw body, content type, status, code)
    ("truncated JSON", b'{"spec": {', "application/json", 400, "malformed_body"),
    ("not JSON at all", b"spec=1", "application/json", 400, "malformed_body"),
    (
        "NaN is not JSON",
        b'{"spec": {"model": {"id": "a/b"}, "repeats": NaN}}',
        "application/json",
        400,
        "malformed_body",
    ),
    (
        "deeply nested JSON",
        b"[" * 100_000 + b"]" * 100_000,
        "application/json",
        400,
        "malformed_body",
    ),
    ("JSON array body", b"[1, 2, 3]", "application/json", 400, "invalid_spec"),
    ("JSON string body", b'"seed"', "application/json", 400, "invalid_spec"),
    ("empty body", b"", "application/json", 400, "invalid_spec"),
    ("invalid UTF-8", b'{"preset": "\xff\xfe"}', "application/json", 400, "malformed_body"),
    ("broken YAML", b"model: [unclosed", "application/yaml", 400, "malformed_body"),
    (
        "YAML alias bomb",
        b"a: &a [x, x]\nb: &b [*a, *a]\nmodel: {id: a/b}\n",
        "application/yaml",
        400,
        "malformed_body",
    ),
    ("YAML that is a list", b"- 1\n- 2\n", "application/yaml", 400, "invalid_spec"),
    (
        "form encoding",
        b"spec=1",
        "application/x-www-form-urlencoded",
        415,
        "unsupported_media_type",
    ),
    (
        "over the size limit",
        b'{"name": "' + b"x" * 1_100_000 + b'"}',
        "application/json",
        413,
        "body_too_large",
    ),
]


@pytest.mark.parametrize(
    ("raw", "content_type", "status", "code"),
    [c[1:] for c in MALFORMED],
    ids=[c[0] for c in MALFORMED],
)
def test_it_answers_malformed_bodies_with_a_4xx(
    personas, raw, content_type, status, code, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks:
        response = personas["owner"].client.post(RUNS, raw, content_type=content_type)
    assert response.status_code == status, response.content[:500]
    assert response.json()["error"]["code"] == code
    assert Run.objects.count() == 0
    assert callbacks == []


@pytest.mark.parametrize("who", ["other", "anon"])
def test_other_personas_get_the_same_answers_or_401(personas, spec_dict, who):
    body = json.dumps(_with("workload.input_len", -1)(spec_dict))
    response = personas[who].client.post(RUNS, body, content_type="application/json")
    if who == "anon":
        assert response.status_code == 401  # authentication comes before validation
    else:
        assert response.status_code == 400
        assert response.json()["error"]["field"] == "spec.workload.input_len"
    assert Run.objects.count() == 0
