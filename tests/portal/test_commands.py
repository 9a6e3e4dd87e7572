"""Management commands for the quickstart: createdemo, submitrun."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from portal.accounts.models import ApiToken
from portal.accounts.tokens import verify_token
from portal.benchmarks.models import Run

pytestmark = pytest.mark.django_db


@pytest.fixture
def dev(settings, tmp_path, monkeypatch):
    settings.DEV = True
    settings.SERVEBENCH_HOME = tmp_path
    monkeypatch.delenv("SERVEBENCH_DEMO_PASSWORD", raising=False)


def test_createdemo_is_idempotent_and_prints_working_credentials(dev, capsys, client):
    call_command("createdemo", "--json")
    first = json.loads(capsys.readouterr().out)
    call_command("createdemo", "--json")
    second = json.loads(capsys.readouterr().out)
    assert first["username"] == second["username"] == "demo"
    assert first["password"] == second["password"]  # stable across restarts
    assert client.login(username="demo", password=second["password"])
    # A restart keeps the token the first one printed (a shell may have exported it).
    assert second["token"] == first["token"] and second["kept"] and not first["kept"]
    assert verify_token(second["token"]).user.username == "demo"
    assert ApiToken.objects.filter(revoked_at__isnull=True).count() == 1
    # Revoked meanwhile (on the tokens page): the next start issues a new one, and says so.
    ApiToken.objects.update(revoked_at=timezone.now())
    call_command("createdemo")
    out = capsys.readouterr().out
    assert "API token (new): sb_ci_" in out and first["token"] not in out
    assert ApiToken.objects.filter(revoked_at__isnull=True).count() == 1


def test_createdemo_refuses_outside_development(settings):
    settings.DEV = False
    with pytest.raises(CommandError, match="for development"):
        call_command("createdemo")


def test_submitrun_from_a_spec_file_prints_the_permalink(
    make_user, spec_dict, tmp_path, capsys, django_capture_on_commit_callbacks
):
    import yaml

    make_user("alice")
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(spec_dict()))
    with django_capture_on_commit_callbacks() as callbacks:
        call_command("submitrun", "--user", "alice", "--spec", str(path), "--public")
    run = Run.objects.get()
    assert capsys.readouterr().out.strip() == f"http://testserver/runs/{run.public_id}/"
    assert run.is_public and run.owner.username == "alice"
    assert len(callbacks) == 1


def test_submitrun_names_the_bad_field(make_user, tmp_path):
    make_user("alice")
    path = tmp_path / "bad.yaml"
    path.write_text("model: {id: a/b}\nworkload: {input_len: -3}\n")
    with pytest.raises(CommandError, match=r"workload\.input_len"):
        call_command("submitrun", "--user", "alice", "--spec", str(path))
    assert Run.objects.count() == 0


def test_submitrun_from_a_preset(make_user, capsys):
    make_user("alice")
    call_command("submitrun", "--user", "alice", "--preset", "seed")
    assert Run.objects.get().model_id == "Qwen/Qwen3-0.6B"
