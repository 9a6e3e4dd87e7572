"""Schemathesis against the live test server: every operation of the OpenAPI schema, with
valid and invalid inputs, must never be answered with a 5xx.

The server is pytest-django's ``live_server`` (a real HTTP server on real PostgreSQL). The
REST API is called with a CI token; the runner endpoints with a run token, on the run it
belongs to. Path ids are a real private run, a real public run, or whatever Schemathesis
invents. Every call is counted; the numbers are printed and the test
fails listing each 5xx with a curl command that repeats it.

``make test`` runs it as a session of its own, beside the cluster's tests (marker
``fuzz``, ``scripts/suite.py``); ``FUZZ_EXAMPLES`` sets the examples per operation
(default 80: about 1,200 calls).

Schemathesis generates what the schema describes; hostile input mostly is not that. A
second test generates it with Hypothesis: JSON values whose keys and strings draw from
lone surrogates, NUL, CR/LF, other C0 and C1 controls and bidirectional overrides,
integers beyond 64 bits, NaN and infinities, nested up to thousands of levels and with
keys given twice, sent as raw JSON text into every body an endpoint takes (a run, a
baseline mark, a runner's events and measurements) and as query parameters. None may be
answered with a 5xx, and every 4xx must carry the API's error body (it must render).
"""

from __future__ import annotations

import gzip
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
import requests
import schemathesis
import webdata
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from portal.accounts.models import ApiToken
from portal.accounts.tokens import create_user_token, issue_token
from portal.benchmarks import intake
from portal.benchmarks.models import Run, RunStatus
from runners.spec import free_text_problem
from tests.portal.conftest import measurement_body

pytestmark = [pytest.mark.fuzz, pytest.mark.django_db(transaction=True)]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "80"))

# The runner's samples upload takes gzip-compressed JSON (runners.samplesfile): whole gzip
# of JSON values, random bytes, and gzip cut short.
_GZIP_BODIES = st.one_of(
    st.dictionaries(st.text(max_size=8), st.lists(st.floats(allow_nan=False), max_size=4)).map(
        lambda d: gzip.compress(json.dumps(d).encode())
    ),
    st.binary(max_size=64),
    st.binary(min_size=1, max_size=32).map(lambda b: gzip.compress(b)[:-5]),
)
schemathesis.openapi.media_type("application/gzip", _GZIP_BODIES)
MIN_CALLS = 1000


@pytest.fixture
def portal(live_server: Any, make_user: Any) -> dict[str, Any]:
    owner = make_user("fuzz-owner")
    make_user("fuzz-other")
    ci = create_user_token(owner, "fuzz").plaintext
    with transaction.atomic():
        private = intake.create_run(owner, webdata.sweep_spec([1, 4]), "private run")
    Run.objects.filter(pk=private.pk).update(status=RunStatus.RUNNING)
    public = webdata.make_sweep_run(owner, [1, 4], public=True, name="public run")
    run_token = issue_token(owner, kind=ApiToken.Kind.RUN, run=private).plaintext
    return {
        "url": live_server.url,
        "ci": ci,
        "run_token": run_token,
        "ids": [private.public_id, public.public_id],
    }


def test_no_generated_call_is_answered_with_a_server_error(
    portal: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    schema = schemathesis.openapi.from_url(f"{portal['url']}/api/v1/schema/?format=json")
    tally = Tally()
    started = time.monotonic()
    for result in schema.get_all_operations():
        fuzz(result.ok(), portal, tally)
    seconds = time.monotonic() - started
    total = sum(tally.calls.values())
    server_errors = sum(n for code, n in tally.statuses.items() if code >= 500)
    with capsys.disabled():  # the numbers, whatever pytest captures
        print(
            f"\nschemathesis: {total} calls to {len(tally.calls)} operations in {seconds:.0f} s; "
            f"{server_errors} answered 5xx; statuses {dict(sorted(tally.statuses.items()))}"
        )
    assert not tally.errors, "server errors:\n" + "\n".join(tally.errors)
    assert total >= MIN_CALLS, f"only {total} calls; raise FUZZ_EXAMPLES"


@dataclass
class Tally:
    calls: dict[str, int] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def fuzz(operation: Any, portal: dict[str, Any], tally: Tally) -> None:
    """EXAMPLES valid and invalid calls of one operation, each counted in ``tally``."""
    runner = "/runner/" in operation.path
    headers = {"Authorization": f"Bearer {portal['run_token' if runner else 'ci']}"}
    ids = portal["ids"][:1] if runner else portal["ids"]
    strategy = st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )
    choice = st.sampled_from([None, *ids]) if "{public_id}" in operation.path else st.none()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy, real_id=choice)
    def call(case: Any, real_id: str | None) -> None:
        if real_id is not None:
            case.path_parameters = {**(case.path_parameters or {}), "public_id": real_id}
        response = case.call(base_url=portal["url"], headers=headers, timeout=30)
        tally.calls[operation.label] = tally.calls.get(operation.label, 0) + 1
        tally.statuses[response.status_code] = tally.statuses.get(response.status_code, 0) + 1
        if response.status_code >= 500 and len(tally.errors) < 30:
            curl = case.as_curl_command(headers)
            tally.errors.append(f"{response.status_code} {operation.label}: {curl}")

    call()


# --------------------------------------------------------------------------- hostile bodies

HOSTILE_CHARS = ["\ud800", "\udfff", "\x00", "\r", "\n", "\t", "\x1b", "\x7f", "\x85",
                 "\u202e", "\u2066", "\ufeff", "a", ".", "é", "\U0001f600"]  # fmt: skip
HOSTILE_EXAMPLES = int(os.environ.get("FUZZ_HOSTILE_EXAMPLES", "100"))
text = st.lists(st.sampled_from(HOSTILE_CHARS), max_size=8).map("".join)
leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
)
values = st.recursive(
    leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)),
    max_leaves=12,
)
# How the value's JSON text is made worse: as is, a key given twice, or nested deep.
MANGLE = ["as is", "duplicate key", "deep array", "deep object"]


def hostile_json(value: Any, mangle: str, depth: int) -> str:
    raw = json.dumps(value, ensure_ascii=True)  # lone surrogates as \udXXX, NaN as NaN
    if mangle == "duplicate key":
        return '{"dup": @, "dup": @}'.replace("@", raw)
    if mangle == "deep array":
        return "[" * depth + raw + "]" * depth
    if mangle == "deep object":
        return '{"k": ' * depth + raw + "}" * depth
    return raw


def _bodies(portal: dict[str, Any], value: str) -> list[tuple[str, str, str]]:
    """(token kind, path, JSON body) for each body-taking endpoint, ``value`` inside."""
    private = portal["ids"][0]
    measurement = json.dumps(measurement_body()).replace('"raw": {', '"raw": {"x": @, ')
    runner = f"/api/v1/runner/runs/{private}"
    bodies = [
        ("ci", "/api/v1/runs/", '{"spec": @}'),
        ("ci", "/api/v1/runs/", '{"spec": {"model": {"id": "org/m"}, "x": @}}'),
        ("ci", "/api/v1/runs/", '{"preset": "seed", "name": @}'),
        ("ci", f"/api/v1/runs/{private}/baseline", '{"label": @}'),
        ("run_token", f"{runner}/events",
         '{"type": "environment", "fingerprint": "ab", "environment": {"x": @}}'),
        ("run_token", f"{runner}/measurements", measurement),
    ]  # fmt: skip
    return [(kind, path, template.replace("@", value)) for kind, path, template in bodies]


QUERIES = [
    "/api/v1/runs/?model={v}",
    "/api/v1/runs/?owner={v}&status={v}",
    "/api/v1/baselines/?label={v}",
    "/api/v1/runs/resolve?ref={v}",
    "/api/v1/compare/?runs={v}",
    "/api/v1/history/?fingerprint={v}&metric={v}",
    "/api/v1/runs/?{v}=1",
]


def test_no_hostile_body_or_parameter_is_answered_with_a_server_error(
    portal: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    tally = Tally()
    session = requests.Session()
    private = portal["ids"][0]

    def count(label: str, response: requests.Response, what: str) -> None:
        tally.calls[label] = tally.calls.get(label, 0) + 1
        tally.statuses[response.status_code] = tally.statuses.get(response.status_code, 0) + 1
        refused = response.status_code >= 400 and "error" not in _json_or_none(response)
        if (response.status_code >= 500 or refused) and len(tally.errors) < 30:
            tally.errors.append(f"{response.status_code} {label}: {what[:300]}")

    @settings(
        max_examples=HOSTILE_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        value=values,
        mangle=st.sampled_from(MANGLE),
        depth=st.sampled_from([33, 1_000, 10_000]),
        raw=text,
    )
    def call(value: Any, mangle: str, depth: int, raw: str) -> None:
        body_value = hostile_json(value, mangle, depth)
        for kind, path, body in _bodies(portal, body_value):
            headers = {
                "Authorization": f"Bearer {portal[kind]}",
                "Content-Type": "application/json",
            }
            response = session.post(portal["url"] + path, data=body.encode(), headers=headers,
                                    timeout=30)  # fmt: skip
            count("POST " + path.replace(private, "{id}"), response, body)
        # The same text in a query, percent-encoded as UTF-8 (a lone surrogate cannot be:
        # its bytes are sent as they are, which is not UTF-8 either).
        encoded = quote(raw.encode("utf-8", "surrogatepass"), safe="")
        for query in QUERIES:
            url = portal["url"] + query.format(v=encoded)
            response = session.get(url, headers={"Authorization": f"Bearer {portal['ci']}"},
                                   timeout=30)  # fmt: skip
            count("GET " + query.split("?")[0], response, url)

    try:
        call()
    finally:
        session.close()  # no kept-alive connection holds the live server's database
    total = sum(tally.calls.values())
    with capsys.disabled():
        print(
            f"\nhostile fuzz: {total} calls to {len(tally.calls)} operations; statuses "
            f"{dict(sorted(tally.statuses.items()))}"
        )
    assert not tally.errors, "server errors or unrendered refusals:\n" + "\n".join(tally.errors)
    # What was accepted (a plain name, a raw value) was stored; nothing hostile was.
    names = Run.objects.values_list("name", flat=True)
    assert not [n for n in names if n and free_text_problem(n)], list(names)


def _json_or_none(response: requests.Response) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
