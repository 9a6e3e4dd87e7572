"""API tokens: prefixed, stored as lookup + HMAC, shown once, revocable."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from portal.accounts import tokens
from portal.accounts.models import ApiToken

pytestmark = pytest.mark.django_db


def test_a_ci_token_is_prefixed_and_its_plaintext_is_not_stored(make_user):
    user = make_user()
    issued = tokens.create_user_token(user, "ci")
    assert issued.plaintext.startswith("sb_ci_")
    row = ApiToken.objects.get(pk=issued.token.pk)
    stored = " ".join(str(v) for v in ApiToken.objects.filter(pk=row.pk).values_list().get())
    secret = issued.plaintext.removeprefix("sb_ci_")
    assert secret not in stored
    assert row.digest != secret and len(row.digest) == 64
    assert row.lookup == secret[: tokens.LOOKUP_CHARS]


def test_verify_accepts_the_token_and_records_use(make_user):
    issued = tokens.create_user_token(make_user())
    found = tokens.verify_token(issued.plaintext)
    assert found is not None and found.pk == issued.token.pk
    assert found.last_used_at is not None


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # same lookup, wrong secret
        lambda t: t.replace("sb_ci_", "sb_run_"),  # right secret, wrong kind
        lambda t: t.removeprefix("sb_ci_"),  # no prefix
        lambda t: "sb_ci_short",
        lambda t: "",
    ],
)
def test_verify_rejects_anything_else(make_user, mangle):
    issued = tokens.create_user_token(make_user())
    assert tokens.verify_token(mangle(issued.plaintext)) is None


def test_a_revoked_or_expired_token_stops_working(make_user):
    user = make_user()
    revoked = tokens.create_user_token(user)
    assert tokens.revoke_token(revoked.token)
    assert not tokens.revoke_token(revoked.token)
    assert tokens.verify_token(revoked.plaintext) is None
    expired = tokens.issue_token(user, expires_at=timezone.now() - timedelta(seconds=1))
    assert tokens.verify_token(expired.plaintext) is None


def test_a_deactivated_users_token_stops_working(make_user):
    user = make_user()
    issued = tokens.create_user_token(user)
    user.is_active = False
    user.save()
    assert tokens.verify_token(issued.plaintext) is None


def test_a_run_token_is_scoped_to_its_run(make_run):
    run = make_run()
    issued = tokens.issue_token(run.owner, kind=ApiToken.Kind.RUN, run=run)
    assert issued.plaintext.startswith("sb_run_")
    assert tokens.verify_token(issued.plaintext).run_id == run.pk
    with pytest.raises(ValueError, match="needs its run"):
        tokens.issue_token(run.owner, kind=ApiToken.Kind.RUN)


def test_createtoken_prints_the_token_once(make_user, capsys):
    user = make_user("alice")
    call_command("createtoken", "alice", "--name", "github")
    out = capsys.readouterr().out.strip()
    assert out.startswith("sb_ci_")
    token = tokens.verify_token(out)
    assert token.user == user and token.name == "github"


def test_createtoken_names_a_missing_user(make_user):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("createtoken", "nobody")
