"""404 and 500 are the project's own pages (never Django's debug page), JSON under /api/."""

from __future__ import annotations

from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

import portal.urls

pytestmark = pytest.mark.django_db


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug")


# This module is the URL conf of the tests below: the portal's, plus a view that fails.
urlpatterns = [path("boom/", boom), path("api/v1/boom/", boom), *portal.urls.urlpatterns]
handler400 = portal.urls.handler400
handler404 = portal.urls.handler404
handler500 = portal.urls.handler500


@pytest.fixture
def failing(settings: Any) -> Client:
    settings.ROOT_URLCONF = __name__
    settings.DEBUG = False
    return Client(raise_request_exception=False)


def test_a_server_error_shows_the_projects_page(failing: Client) -> None:
    response = failing.get("/boom/")
    assert response.status_code == 500
    page = response.content.decode()
    assert "Something went wrong" in page and "a bug" not in page
    assert "Traceback" not in page and "<script" not in page
    api = failing.get("/api/v1/boom/")
    assert api.status_code == 500 and api.json()["error"]["code"] == "server_error"


def test_not_found_shows_the_projects_page_with_a_way_on(failing: Client, make_user: Any) -> None:
    response = failing.get("/no/such/page/")
    assert response.status_code == 404
    page = response.content.decode()
    assert 'id="not-found"' in page and "Sign in" in page and "Resolver404" not in page
    signed_in = Client()
    signed_in.force_login(make_user())
    assert "Back to the runs you can see" in signed_in.get("/no/such/page/").content.decode()
    api = failing.get("/api/v1/no-such-endpoint/")
    assert api.status_code == 404 and api.json()["error"]["code"] == "not_found"
