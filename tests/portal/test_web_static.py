"""Page weight: plotly.js is our own pinned copy of its basic bundle (no CDN, no package
finder), static files are served hashed, gzip-compressed and cached for a year, and pages
themselves are compressed."""

from __future__ import annotations

import gzip
import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.templatetags.static import static
from django.test import Client

REPO = Path(__file__).resolve().parents[2]
VENDOR = REPO / "portal" / "web" / "static" / "web" / "vendor"
PLOTLY = "web/vendor/plotly-basic.min.js"
PLOTLY_VERSION = "4.1.1"
PLOTLY_SHA256 = "99784e3abfb07b142a15e521a439e6d9addceadb3f79553fd24c72774f0649ba"
YEAR = 365 * 24 * 3600
# The other apps' static files (admin, API docs) are collected in production too; leaving
# them out keeps this test quick without changing what it checks about ours.
OTHERS = ["admin", "rest_framework", "drf_spectacular_sidecar", "drf-yasg"]


def test_the_vendored_plotly_is_the_pinned_basic_bundle() -> None:
    path = Path(finders.find(PLOTLY))
    body = path.read_bytes()
    assert hashlib.sha256(body).hexdigest() == PLOTLY_SHA256
    assert f"plotly.js (basic - minified) v{PLOTLY_VERSION}".encode() in body[:400]
    readme = (VENDOR / "README.md").read_text()
    assert PLOTLY_SHA256 in readme and f"plotly.js-basic-dist-min@{PLOTLY_VERSION}" in readme
    assert (VENDOR / "plotly-LICENSE.txt").read_text().startswith("MIT License")
    # A quarter of the full bundle the pages used to load (4.8 MB).
    assert len(body) < 1_300_000


def test_every_page_loads_plotly_from_our_static_files_only() -> None:
    templates = REPO / "portal" / "web" / "templates"
    for template in templates.rglob("*.html"):
        text = template.read_text()
        assert "vendor/plotly.min.js" not in text, template
        assert not re.search(r"<script[^>]+src=\"https?://", text), template
        if "plotly" in text:
            assert "{% static 'web/vendor/plotly-basic.min.js' %}" in text, template


@pytest.fixture
def collected(settings: Any, tmp_path: Path) -> Path:
    """Static files collected as production collects them: hashed names, pre-compressed,
    served by whitenoise from STATIC_ROOT."""
    settings.STATIC_ROOT = tmp_path
    settings.WHITENOISE_USE_FINDERS = False
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    call_command("collectstatic", interactive=False, verbosity=0, ignore_patterns=OTHERS)
    return tmp_path


@pytest.mark.django_db
def test_static_files_are_hashed_compressed_and_cached_for_a_year(collected: Path) -> None:
    client = Client(headers={"Accept-Encoding": "gzip, deflate, br"})
    for name in (PLOTLY, "web/servebench.js", "web/servebench.css", "web/run.js"):
        url = static(name)
        assert re.search(r"\.[0-9a-f]{12}\.(js|css)$", url), url  # a hashed name
        response = client.get(url)
        assert response.status_code == 200, url
        body = b"".join(response.streaming_content)
        response.close()
        assert response["Content-Encoding"] == "gzip", url
        control = response["Cache-Control"]
        assert "immutable" in control and "public" in control, control
        assert int(re.search(r"max-age=(\d+)", control).group(1)) >= YEAR, control
        raw = Path(finders.find(name)).read_bytes()
        assert gzip.decompress(body) == raw
        if name == PLOTLY:
            assert len(body) < 450_000  # what a first visit downloads for the charts


@pytest.mark.django_db
def test_pages_are_compressed_for_browsers_that_accept_it(make_user: Any) -> None:
    client = Client(headers={"Accept-Encoding": "gzip"})
    client.force_login(make_user())
    response = client.get("/runs/")
    assert response.status_code == 200
    assert response["Content-Encoding"] == "gzip"
    assert b"<h1>Runs</h1>" in gzip.decompress(response.content)
    assert "Accept-Encoding" in response["Vary"]
    plain = Client()
    plain.force_login(make_user())
    assert "Content-Encoding" not in plain.get("/runs/")
