"""Schemathesis against the live test server: every operation of the OpenAPI schema, with
valid and invalid inputs, must never be answered with a 5xx.

The server is pytest-django's ``live_server`` (a real HTTP server on real PostgreSQL). The
REST API is called with a CI token; the runner endpoints with a run token, on the run it
belongs to. Path ids are a real private run, a real public run, or whatever Schemathesis
invents. Every call is counted; the numbers are printed and the test
fails listing each 5xx with a curl command that repeats it.

``make test`` runs it on its own step (marker ``fuzz``); ``FUZZ_EXAMPLES`` sets the
examples per operation (default 80: about 1,200 calls).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
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

pytestmark = [pytest.mark.fuzz, pytest.mark.django_db(transaction=True)]

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "80"))
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
