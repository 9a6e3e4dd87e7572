"""Short ids: a unique prefix of a run's public id (the 8 characters every page, message
and `make run` shows) names the run on pages (a redirect to the permalink) and in the API,
under the one access rule (``queries.run_access``): an owner, a teammate who is not the
owner, and an anonymous visitor each see exactly what they may read, and an ambiguous or
unknown prefix says so without revealing anyone's private run."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from portal.benchmarks import queries
from portal.benchmarks.models import Run, RunStatus

pytestmark = pytest.mark.django_db


def with_id(run: Run, public_id: str) -> Run:
    Run.objects.filter(pk=run.pk).update(public_id=public_id)
    run.refresh_from_db()
    return run


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def runs(personas: dict[str, Any], make_run: Any) -> dict[str, Run]:
    """Two of the owner's runs sharing 'abcd1', a private run of the other user sharing
    'abcd' with them, and a public run of the other user."""
    owner, other = personas["owner"].user, personas["other"].user
    return {
        "mine1": with_id(make_run(owner=owner), "abcd1111" + "a" * 12),
        "mine2": with_id(make_run(owner=owner), "abcd1222" + "a" * 12),
        "theirs": with_id(make_run(owner=other), "abcd9999" + "a" * 12),
        "public": with_id(make_run(owner=other, is_public=True), "pub12345" + "b" * 12),
    }


def test_a_short_id_redirects_to_the_permalink_and_keeps_the_subpage(
    personas: dict[str, Any], runs: dict[str, Run]
) -> None:
    client = signed_in(personas["owner"].user)
    mine = runs["mine1"]
    response = client.get("/runs/abcd1111/")
    assert response.status_code == 302 and response["Location"] == mine.get_absolute_url()
    response = client.get("/runs/abcd1111/spec.yaml?x=1")
    assert response["Location"] == f"/runs/{mine.public_id}/spec.yaml?x=1"
    assert client.get(response["Location"]).status_code == 200
    # Anyone reads a public run by its short id; the full id answers directly.
    assert Client().get("/runs/pub12345/")["Location"] == runs["public"].get_absolute_url()
    assert client.get(f"/runs/{mine.public_id}/status.json").status_code == 200


def test_a_post_by_short_id_acts_on_the_run_it_names(
    personas: dict[str, Any], runs: dict[str, Run]
) -> None:
    mine = runs["mine2"]
    Run.objects.filter(pk=mine.pk).update(status=RunStatus.QUEUED)
    response = signed_in(personas["owner"].user).post("/runs/abcd12/cancel/")
    assert response.status_code == 302
    mine.refresh_from_db()
    assert mine.status == RunStatus.CANCELLED
    # Not the other user's to cancel: 404, as for a full id.
    assert signed_in(personas["other"].user).post("/runs/abcd11/cancel/").status_code == 404


def test_an_ambiguous_prefix_lists_only_the_visitors_own_matches(
    personas: dict[str, Any], runs: dict[str, Run]
) -> None:
    response = signed_in(personas["owner"].user).get("/runs/abcd1/")
    assert response.status_code == 404
    page = response.content.decode()
    assert "more than one run id you can see" in page and 'id="not-found"' in page
    assert runs["mine1"].get_absolute_url() in page and runs["mine2"].get_absolute_url() in page
    assert runs["theirs"].public_id not in page and "abcd9999" not in page
    # The other user's private run does not make 'abcd9' ambiguous for its owner...
    assert (
        signed_in(personas["other"].user).get("/runs/abcd9/")["Location"]
        == runs["theirs"].get_absolute_url()
    )
    # ...and does not exist for anyone else: the same answer as for no run at all.
    for client in (signed_in(personas["owner"].user), Client()):
        hidden = client.get("/runs/abcd9/")
        nothing = client.get("/runs/zzzz9/")
        assert hidden.status_code == nothing.status_code == 404
        assert "No run id that you can see starts with" in hidden.content.decode()
        assert runs["theirs"].public_id not in hidden.content.decode()


def test_unknown_and_too_short_ids_get_the_projects_404_page(
    personas: dict[str, Any], runs: dict[str, Run]
) -> None:
    client = signed_in(personas["owner"].user)
    short = client.get("/runs/abc/")
    assert short.status_code == 404
    assert "too short to name a run" in short.content.decode()
    full = client.get("/runs/" + "q" * 20 + "/")
    assert full.status_code == 404
    assert "No such run, or it is private to its owner." in full.content.decode()
    assert "Django" not in full.content.decode()  # the project's page, not a debug page
    assert client.get("/no/such/page/").status_code == 404


def test_the_api_resolves_prefixes_under_the_same_rule(
    personas: dict[str, Any], runs: dict[str, Run]
) -> None:
    owner, other, anon = (personas[k].client for k in ("owner", "other", "anon"))
    body = owner.get("/api/v1/runs/abcd1111/").json()
    assert body["id"] == runs["mine1"].public_id
    assert owner.get("/api/v1/runs/abcd1111/spec?format=json").status_code == 200
    ambiguous = owner.get("/api/v1/runs/abcd1/")
    assert ambiguous.status_code == 400
    error = ambiguous.json()["error"]
    assert error["code"] == "ambiguous_id" and error["field"] == "id"
    assert "more of the id" in error["message"]
    assert sorted(ambiguous.json()["matches"]) == sorted(
        r.public_id for r in (runs["mine1"], runs["mine2"])
    )
    for client in (owner, anon):
        hidden = client.get("/api/v1/runs/abcd9/")
        assert hidden.status_code == 404
        assert runs["theirs"].public_id not in hidden.content.decode()
    assert other.get("/api/v1/runs/abcd9/").json()["id"] == runs["theirs"].public_id
    assert anon.get("/api/v1/runs/pub1/").json()["id"] == runs["public"].public_id
    too_short = owner.get("/api/v1/runs/abc/")
    assert too_short.status_code == 404
    assert f"at least {queries.MIN_ID_PREFIX} characters" in too_short.json()["error"]["message"]
    # Acting through a prefix: only the owner may cancel.
    Run.objects.filter(pk=runs["mine1"].pk).update(status=RunStatus.QUEUED)
    assert other.post("/api/v1/runs/abcd11/cancel").status_code == 404
    assert owner.post("/api/v1/runs/abcd11/cancel").status_code == 202
    # The resolve endpoint (what the CLI calls) takes a unique prefix too.
    resolved = owner.get("/api/v1/runs/resolve", {"ref": "abcd12"}).json()
    assert resolved["id"] == runs["mine2"].public_id


def test_the_lookup_agrees_with_the_one_access_rule(
    personas: dict[str, Any], runs: dict[str, Run]
) -> None:
    """For every persona and run: the short id finds the run exactly when may_view."""
    from django.contrib.auth.models import AnonymousUser

    users = {"owner": personas["owner"].user, "other": personas["other"].user}
    users["anon"] = AnonymousUser()
    for user in users.values():
        for run in runs.values():
            try:
                found = queries.get_visible_run(user, run.short_id)
            except queries.AmbiguousRunId:
                assert queries.may_view(user, run)  # only visible runs make it ambiguous
                continue
            except Run.DoesNotExist:
                found = None
            assert (found == run) == queries.may_view(user, run), (user, run.public_id)
