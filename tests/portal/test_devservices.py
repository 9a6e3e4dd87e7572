"""portal.devservices: real PostgreSQL and Redis from pip wheels, kept alive across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis

from portal import devservices

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path_factory):
    # Short path: unix sockets live under it.
    path = Path(tmp_path_factory.mktemp("dev", numbered=True))
    yield path
    devservices.stop(path)


def cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return subprocess.run(
        [sys.executable, "-m", "portal.devservices", *args, "--home", str(home)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_start_env_status_stop(home):
    started = cli("start", "--json", home=home)
    assert started.returncode == 0, started.stderr
    urls = json.loads(started.stdout)
    assert urls["DATABASE_URL"].startswith("postgresql://")
    assert urls["REDIS_URL"].startswith("redis+socket:///")
    # The servers outlived the process that started them.
    with psycopg.connect(urls["DATABASE_URL"]) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("servebench",)
    sock = urls["REDIS_URL"].removeprefix("redis+socket://")
    assert redis.Redis(unix_socket_path=sock).ping()
    # A second start reuses them; env prints shell exports.
    exports = cli("env", home=home)
    assert exports.returncode == 0
    assert f"export REDIS_URL={urls['REDIS_URL']}" in exports.stdout
    assert "export DATABASE_URL=" in exports.stdout
    assert cli("status", home=home).returncode == 0
    stopped = cli("stop", home=home)
    assert "postgres" in stopped.stderr and "redis" in stopped.stderr
    assert cli("status", home=home).returncode == 1


def test_urls_already_in_the_environment_win(home, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://someone@db.example:5432/x")
    monkeypatch.setenv("REDIS_URL", "redis://cache.example:6379/0")
    urls = devservices.ensure(home)
    assert urls.database_url == "postgres://someone@db.example:5432/x"
    assert urls.redis_url == "redis://cache.example:6379/0"
    assert not devservices.postgres_running(home) and not devservices.redis_running(home)


def test_a_second_start_says_whose_lock_it_waits_for(home):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    with devservices._locked(home):  # another build or `make run` is starting them
        second = subprocess.Popen(
            [sys.executable, "-m", "portal.devservices", "start", "--json", "--home", str(home)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        first = second.stderr.readline()
        assert first.startswith(f"{devservices.NOTE} waiting for pid {os.getpid()} (")
        assert f"lock {home / '.lock'}" in first
        assert second.poll() is None  # it waits rather than failing
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert "got the lock after" in err
    assert set(json.loads(out)) == {"DATABASE_URL", "REDIS_URL"}


def test_a_failed_start_says_why(home):
    (home / "redis").write_text("a file where the Redis directory belongs")
    done = cli("start", "--json", home=home)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "", done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"could not start the embedded services in {home}: "), done.stderr
    assert "FileExistsError" in line, done.stderr
