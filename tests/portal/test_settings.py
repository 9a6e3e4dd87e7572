"""Settings: env readers fail loudly and say what to do; secrets from NAME_FILE."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.lib import env

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("SB_TEST_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_typed_readers(clean_env):
    clean_env.setenv("SB_TEST_BOOL", "yes")
    clean_env.setenv("SB_TEST_INT", " 42 ")
    clean_env.setenv("SB_TEST_LIST", "a, b,,c ")
    assert env.boolean("SB_TEST_BOOL", False) is True
    assert env.boolean("SB_TEST_MISSING", True) is True
    assert env.integer("SB_TEST_INT", 1) == 42
    assert env.strings("SB_TEST_LIST", []) == ["a", "b", "c"]
    assert env.string("SB_TEST_MISSING", "dflt") == "dflt"


@pytest.mark.parametrize(
    ("reader", "value", "message"),
    [
        (lambda: env.boolean("SB_TEST_X", False), "maybe", "not a boolean"),
        (lambda: env.integer("SB_TEST_X", 15), "fifteen", "not an integer"),
        (lambda: env.integer("SB_TEST_X", 15, minimum=1), "0", "below the minimum"),
        (lambda: env.choice("SB_TEST_X", "local", ("local", "kubernetes")), "k8s", "not one of"),
        (lambda: env.url("SB_TEST_X", "http://x"), "bench.example.com", r"http\(s\) URL"),
        (lambda: env.database(os.environ["SB_TEST_X"]), "mysql://u@h/db", "PostgreSQL only"),
        (
            lambda: env.database(os.environ["SB_TEST_X"]),
            "postgres://u@h:5432/",
            "names no database",
        ),
        (lambda: env.broker(os.environ["SB_TEST_X"]), "amqp://guest@h//", "redis://"),
    ],
)
def test_bad_values_fail_loudly_naming_the_variable(clean_env, reader, value, message):
    clean_env.setenv("SB_TEST_X", value)
    with pytest.raises(ImproperlyConfigured, match=message) as exc:
        reader()
    assert (
        "SB_TEST_X" in str(exc.value)
        or "DATABASE_URL" in str(exc.value)
        or "REDIS_URL" in str(exc.value)
    )


def test_a_required_variable_says_how_to_set_it(clean_env):
    with pytest.raises(ImproperlyConfigured, match=r"SB_TEST_REQ is not set; set it \(e.g."):
        env.string("SB_TEST_REQ", example="abc")


def test_secrets_can_come_from_a_file(clean_env, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from-a-file\n")
    clean_env.setenv("SB_TEST_KEY_FILE", str(secret))
    clean_env.setenv("SB_TEST_KEY", "ignored")
    assert env.string("SB_TEST_KEY") == "from-a-file"
    clean_env.setenv("SB_TEST_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="cannot be read"):
        env.string("SB_TEST_KEY")


def test_database_urls_tcp_and_unix_socket():
    tcp = env.database("postgres://bench:p%40ss@db.internal:6543/servebench?sslmode=require")
    assert tcp["NAME"] == "servebench" and tcp["USER"] == "bench" and tcp["PASSWORD"] == "p@ss"
    assert (tcp["HOST"], tcp["PORT"]) == ("db.internal", "6543")
    assert tcp["OPTIONS"] == {"sslmode": "require"}
    sock = env.database("postgresql://postgres:@/servebench?host=/tmp/pg")
    assert (sock["HOST"], sock["USER"], sock["NAME"]) == ("/tmp/pg", "postgres", "servebench")
    assert env.broker("redis+socket:///tmp/r.sock") == "redis+socket:///tmp/r.sock"


SHOW_KEY = "import django; django.setup(); from django.conf import settings; " + (
    "print(settings.SECRET_KEY[:4])"
)


def _settings_in_subprocess(
    extra: dict[str, str], drop: tuple[str, ...] = (), code: str = SHOW_KEY
) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    environ.update(extra)
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_production_without_secret_key_refuses_to_start(tmp_path):
    result = _settings_in_subprocess(
        {"DEBUG": "0", "SERVEBENCH_QUICKSTART": "0", "SERVEBENCH_HOME": str(tmp_path)},
        drop=("SECRET_KEY",),
    )
    assert result.returncode != 0
    assert "SECRET_KEY is not set" in result.stderr
    assert not (tmp_path / "dev" / "secret_key").exists()


def test_quickstart_generates_and_keeps_a_secret_key(tmp_path):
    extra = {"SERVEBENCH_QUICKSTART": "1", "SERVEBENCH_HOME": str(tmp_path)}
    first = _settings_in_subprocess(extra, drop=("SECRET_KEY",))
    assert first.returncode == 0, first.stderr
    key_file = tmp_path / "dev" / "secret_key"
    assert oct(key_file.stat().st_mode)[-3:] == "600"
    second = _settings_in_subprocess(extra, drop=("SECRET_KEY",))
    assert first.stdout == second.stdout == key_file.read_text()[:4] + "\n"


def test_a_typo_in_an_executor_name_fails_at_startup():
    result = _settings_in_subprocess({"SERVEBENCH_EXECUTOR": "kubernets"})
    assert result.returncode != 0
    assert "SERVEBENCH_EXECUTOR='kubernets': did you mean 'kubernetes'?" in result.stderr


def test_the_shared_page_cache_reaches_an_embedded_redis_on_its_socket(tmp_path):
    """`make run` sets SERVEBENCH_PAGE_CACHE=redis with the embedded Redis's
    redis+socket:// URL: the pages cache reaches it, and its clear() leaves the broker's
    keys alone (they share the database)."""
    from portal import devservices

    assert env.cache_location("redis+socket:///run/r.sock") == "unix:///run/r.sock"
    assert env.cache_location("redis://h:6379/3") == "redis://h:6379/3"
    # kombu's spellings of what redis-py spells otherwise (a broker URL that works must
    # not give the pages cache a URL redis-py refuses).
    assert env.cache_location("redis+socket:///r.sock?virtual_host=3") == "unix:///r.sock?db=3"
    assert env.cache_location("rediss://:pw@h:6380/0?ssl_cert_reqs=CERT_REQUIRED") == (
        "rediss://:pw@h:6380/0?ssl_cert_reqs=required"
    )
    with pytest.raises(ImproperlyConfigured, match="virtual_host must be a database number"):
        env.cache_location("redis+socket:///r.sock?virtual_host=x")
    home = tmp_path / "home"
    url = devservices.start_redis(home)
    try:
        code = (
            "import django; django.setup(); import redis; "
            "from django.core.cache import caches; from portal.web import pagecache; "
            "c = caches['pages']; c.set('page', {'a': 1}); "
            "r = redis.Redis(unix_socket_path=c._servers[0][len('unix://'):]); "
            "r.set('broker-key', 1); ok = c.get('page') == {'a': 1}; c.clear(); "
            "print(pagecache.shared(), ok, c.get('page'), r.get('broker-key'))"
        )
        result = _settings_in_subprocess(
            {"REDIS_URL": url, "SERVEBENCH_PAGE_CACHE": "redis"}, code=code
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["True", "True", "None", "b'1'"]
    finally:
        devservices.stop_redis(home)


def test_every_variable_the_settings_read_is_in_the_configuration_reference():
    """docs/configuration.md is the one list of the portal's variables (and of the few the
    runners it starts read, marked so): each name a reader in portal/settings.py takes is
    there, and the reference names none that nothing reads."""
    import re

    source = (REPO / "portal" / "settings.py").read_text()
    read = set(re.findall(r'(?:env\.\w+|_k8s_\w+|rates\.rate)\(\s*"([A-Z][A-Z0-9_]+)"', source))
    reference = (REPO / "docs" / "configuration.md").read_text()
    assert len(read) > 100
    assert sorted(n for n in read if not re.search(rf"\b{n}\b", reference)) == []
    documented = set(re.findall(r"\b(SERVEBENCH_[A-Z0-9_]*[A-Z0-9])\b", reference))
    elsewhere = {"SERVEBENCH_CACHE", "SERVEBENCH_HOME"}  # read by portal/lib and the Makefile
    code = "\n".join(
        p.read_text() for tree in ("portal", "runners") for p in (REPO / tree).rglob("*.py")
    )
    assert sorted(n for n in documented - read - elsewhere if n not in code) == []


@pytest.mark.django_db
def test_the_portal_s_connections_compile_no_query():
    """JIT is off: over a large table the planner's estimates pass jit_above_cost and
    compiling cost a history ~200 ms for a 40 ms query (docs/scale.md)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "off"


def test_the_served_app_imports_its_views_and_freezes_the_startup_heap():
    """``portal.wsgi`` (what gunicorn loads) leaves the views imported and the startup
    heap in the collector's permanent generation (``portal.lib.startup``), so full
    collections during a request walk only what requests made."""
    code = (
        "import gc, sys\n"
        "assert gc.get_freeze_count() == 0\n"
        "import portal.wsgi\n"
        "print(gc.get_freeze_count(), 'portal.api.compare_views' in sys.modules,"
        " 'portal.web.views.compare' in sys.modules)\n"
    )
    result = _settings_in_subprocess({}, code=code)
    assert result.returncode == 0, result.stderr
    frozen, api_views, web_views = result.stdout.split()
    assert int(frozen) > 50_000, frozen  # ~134,000: Django, DRF, the spec models, plotly
    assert api_views == web_views == "True"
