"""API rate limits and sign-in throttling, counted in the real Redis: 429 with Retry-After
and a message naming the limit; failed sign-ins refused before the password hasher runs."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from django.contrib.auth.hashers import MD5PasswordHasher
from django.test import Client

from portal.accounts.models import ApiToken
from portal.accounts.tokens import issue_token
from portal.lib.rates import Rate, parse

pytestmark = pytest.mark.django_db

RUNS = "/api/v1/runs/"


class CountingHasher(MD5PasswordHasher):
    """Counts password checks, so a test can tell the hasher never ran."""

    algorithm = "counting-md5"
    checks: ClassVar[list[str]] = []

    def verify(self, password: str, encoded: str) -> bool:
        CountingHasher.checks.append(password)
        return super().verify(password, encoded)


@pytest.fixture
def rates(settings: Any, one_window: Any) -> dict[str, Rate | None]:
    """The API's rates, for a test to set (hour-long windows, each test's calls in one)."""
    settings.SERVEBENCH_RATES = {**settings.SERVEBENCH_RATES}
    one_window(3600, 30)
    return settings.SERVEBENCH_RATES


def test_anonymous_reads_are_limited_per_address(personas, rates):
    rates["anon"] = Rate(3, 3600)
    anon = personas["anon"].client
    assert [anon.get(RUNS).status_code for _ in range(3)] == [200, 200, 200]
    refused = anon.get(RUNS)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 3600
    error = refused.json()["error"]
    assert error["code"] == "throttled"
    assert "3 per hour requests without a token" in error["message"]
    assert "SERVEBENCH_RATE_ANON" in error["message"]
    # A token's requests count in their own scope; another address is another count.
    assert personas["owner"].client.get(RUNS).status_code == 200
    assert Client(REMOTE_ADDR="10.1.2.3").get(RUNS).status_code == 200


def test_ci_tokens_count_per_user_and_runner_tokens_per_run(personas, make_run, rates):
    rates["ci"] = Rate(2, 3600)
    rates["runner"] = Rate(1, 3600)
    owner, other = personas["owner"].client, personas["other"].client
    assert [owner.get(RUNS).status_code for _ in range(3)] == [200, 200, 429]
    assert other.get(RUNS).status_code == 200  # another user, another count
    run = make_run(owner=personas["owner"].user)
    token = issue_token(personas["owner"].user, kind=ApiToken.Kind.RUN, run=run).plaintext
    runner = Client(headers={"Authorization": f"Bearer {token}"})
    event = json.dumps({"type": "progress", "done": 0})
    url = f"/api/v1/runner/runs/{run.public_id}/events"
    assert runner.post(url, event, content_type="application/json").status_code == 200
    refused = runner.post(url, event, content_type="application/json")
    assert (
        refused.status_code == 429
        and "runner reports of this run" in refused.json()["error"]["message"]
    )


def test_submissions_have_a_rate_of_their_own(personas, spec_dict, rates):
    rates["submit"] = Rate(1, 3600)
    owner = personas["owner"].client
    body = json.dumps({"spec": spec_dict()})
    assert owner.post(RUNS, body, content_type="application/json").status_code == 201
    refused = owner.post(RUNS, body, content_type="application/json")
    assert refused.status_code == 429
    assert "1 per hour run submissions" in refused.json()["error"]["message"]
    assert owner.get(RUNS).status_code == 200  # reads are not submissions


def test_when_redis_does_not_answer_requests_pass(personas, rates, settings):
    rates["anon"] = Rate(1, 3600)
    settings.SERVEBENCH_COUNTERS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    anon = personas["anon"].client
    assert [anon.get(RUNS).status_code for _ in range(3)] == [200, 200, 200]


@pytest.fixture
def counted(settings: Any, make_user: Any, one_window: Any) -> Any:
    one_window(3600, 30)  # the sign-in limits below count in hour-long windows
    settings.PASSWORD_HASHERS = [f"{__name__}.CountingHasher"]
    CountingHasher.checks.clear()
    return make_user("victim")


def sign_in(client: Client, username: str, password: str) -> Any:
    return client.post("/login/", {"username": username, "password": password})


def test_failed_sign_ins_are_refused_before_hashing_then_allowed_again(counted, settings):
    settings.SERVEBENCH_SIGNIN_FAILURES_PER_USERNAME = parse("3/3600")
    browser = Client()
    answers = [sign_in(browser, "victim", f"guess-{i}").status_code for i in range(3)]
    assert answers == [200, 200, 200] and len(CountingHasher.checks) == 3
    refused = sign_in(browser, "victim", "pw-victim")  # even the right password
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 3600
    page = refused.content.decode()
    assert 'id="signin-throttled"' in page and "Too many failed sign-ins for this username" in page
    assert len(CountingHasher.checks) == 3  # the hasher did not run
    # The Django admin's sign-in goes through the same backend: refused without hashing.
    admin = browser.post("/admin/login/", {"username": "victim", "password": "x"})
    assert admin.status_code == 200 and len(CountingHasher.checks) == 3
    # Other usernames are not locked by this one's failures.
    assert sign_in(browser, "someone-else", "x").status_code == 200


def test_a_success_clears_the_usernames_count(counted, settings):
    settings.SERVEBENCH_SIGNIN_FAILURES_PER_USERNAME = parse("2/3600")
    browser = Client()
    assert sign_in(browser, "victim", "wrong").status_code == 200
    assert sign_in(browser, "victim", "pw-victim").status_code == 302  # signed in
    browser.logout()
    assert sign_in(Client(), "victim", "wrong").status_code == 200  # counted from zero
    assert sign_in(Client(), "victim", "wrong").status_code == 200
    assert sign_in(Client(), "victim", "wrong").status_code == 429


def test_one_address_guessing_many_usernames_is_refused(counted, settings):
    settings.SERVEBENCH_SIGNIN_FAILURES_PER_ADDRESS = parse("4/3600")
    settings.SERVEBENCH_PROXY_HOPS = 1  # behind one proxy: the address it forwarded
    attacker = Client(HTTP_X_FORWARDED_FOR="203.0.113.7")
    assert [sign_in(attacker, f"user{i}", "x").status_code for i in range(4)] == [200] * 4
    refused = sign_in(attacker, "victim", "pw-victim")
    assert refused.status_code == 429 and "for your address" in refused.content.decode()
    # Someone else behind the same proxy signs in.
    assert (
        sign_in(Client(HTTP_X_FORWARDED_FOR="198.51.100.2"), "victim", "pw-victim").status_code
        == 302
    )


def test_rates_are_read_loudly():
    from django.core.exceptions import ImproperlyConfigured

    assert parse("600/min") == Rate(600, 60) and parse("10/900") == Rate(10, 900)
    assert parse("off") is None and parse("0") is None
    for bad in ("600", "ten/min", "5/fortnight", "-1/min"):
        with pytest.raises(ImproperlyConfigured, match="is not a rate"):
            parse(bad, "SERVEBENCH_RATE_X")
