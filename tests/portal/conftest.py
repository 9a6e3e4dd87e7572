"""Fixtures for the portal's tests: real PostgreSQL, real Redis, real Celery worker.

Services: ``DATABASE_URL`` / ``REDIS_URL`` from the environment (CI: the machine's
PostgreSQL and Redis); when unset, the embedded servers of ``portal.devservices`` are
started (and left running for the next session). Each session uses its own test database
name and its own Celery queue, so several sessions can share one PostgreSQL and Redis.

Factories (``make_user``, ``make_run``, ``make_measurement``) are fixtures returning
functions; ``personas`` gives the owner / other user / anonymous clients every API test
walks through.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

REPO = Path(__file__).resolve().parents[2]
_SESSION = uuid.uuid4().hex[:8]


def _prepare_environment() -> None:
    if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
        from portal.devservices import ensure

        os.environ.update(ensure().env())
    os.environ.setdefault("SECRET_KEY", "tests-only-" + "k" * 40)
    os.environ.setdefault("SERVEBENCH_STATIC_MANIFEST", "0")
    # Tests share Redis with other sessions (and maybe a running portal): own queue.
    os.environ.setdefault("SERVEBENCH_QUEUE", f"servebench-test-{_SESSION}")
    data_dir = Path(tempfile.gettempdir()) / f"servebench-test-{_SESSION}"
    os.environ.setdefault("SERVEBENCH_DATA_DIR", str(data_dir))
    os.environ.setdefault("SERVEBENCH_PUBLIC_URL", "http://testserver")
    # Local model directories a spec may name: where the tiny test model is built.
    cache = os.environ.get("SERVEBENCH_CACHE") or str(Path.home() / ".cache" / "servebench")
    os.environ.setdefault("SERVEBENCH_MODEL_ROOTS", cache)
    os.environ.setdefault("SERVEBENCH_STOP_GRACE_SECONDS", "3")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")


_prepare_environment()


def pytest_configure(config: pytest.Config) -> None:
    # Without collectstatic, whitenoise notes that STATIC_ROOT does not exist (settings
    # silence it too, but pytest resets warning filters per test).
    config.addinivalue_line("filterwarnings", "ignore:No directory at:UserWarning")
    # pytest-django only sets Django up itself when DJANGO_SETTINGS_MODULE was set before
    # it started; this conftest sets it (after choosing the services), so finish the job,
    # including pytest-django's block on database access outside django_db tests.
    import django.conf
    from pytest_django.plugin import _setup_django

    django.conf.settings.INSTALLED_APPS  # noqa: B018 - loads the settings module
    _setup_django(config)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """A test database of this session's own: sessions sharing a server do not collide."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    db.setdefault("TEST", {})
    db["TEST"]["NAME"] = f"test_{db['NAME']}_{_SESSION}"


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    # The filter drop-downs are cached per user; ids are not reused, but be explicit.
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture(autouse=True)
def _fresh_rate_limits() -> Iterator[None]:
    # Rate-limit windows live in Redis (portal.ops.counters) under this session's prefix;
    # each test starts from zero, as a real client would after a quiet minute.
    from portal.ops import counters

    counters.clear_all_windows()
    yield


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # PBKDF2's deliberate slowness costs ~0.5 s per user; tests are not an attack surface.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


# --------------------------------------------------------------------------- factories


@pytest.fixture
def make_user(db: None) -> Callable[..., Any]:
    from django.contrib.auth import get_user_model

    def make(username: str | None = None, **fields: Any) -> Any:
        User = get_user_model()
        name = username or f"user-{uuid.uuid4().hex[:6]}"
        user = User.objects.create_user(username=name, password="pw-" + name, **fields)
        return user

    return make


def tiny_spec(**overrides: Any) -> dict[str, Any]:
    """A small valid spec dict; ``overrides`` replace top-level keys."""
    spec: dict[str, Any] = {
        "name": "tiny",
        "model": {"id": "org/tiny-model", "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 8, "num_warmups": 0},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1, 4]}],
        "backends": [{"kind": "hf-sequential", "num_prompts": 4}, {"kind": "vllm"}],
        "resources": {"gpu_count": 0, "timeout_minutes": 10},
    }
    spec.update(overrides)
    return spec


@pytest.fixture
def spec_dict() -> Callable[..., dict[str, Any]]:
    return tiny_spec


@pytest.fixture
def make_run(db: None, make_user: Callable[..., Any]) -> Callable[..., Any]:
    """Create a run through the real service (validation included); extra fields are
    then written directly (status, is_public...) to set up a scenario."""
    from django.db import transaction

    from portal.benchmarks import intake
    from portal.benchmarks.models import Run

    def make(owner: Any = None, spec: dict[str, Any] | None = None, **fields: Any) -> Run:
        owner = owner or make_user()
        with transaction.atomic():  # keeps the dispatch enqueue out of reach of `db` tests
            run = intake.create_run(owner, spec or tiny_spec())
        if fields:
            Run.objects.filter(pk=run.pk).update(**fields)
            run.refresh_from_db()
        return run

    return make


def measurement_body(
    backend: str = "vllm",
    point_key: str = "concurrency:max_concurrency=1",
    repeat: int = 0,
    status: str = "succeeded",
    **overrides: Any,
) -> dict[str, Any]:
    """A runners.result.Measurement JSON body as the runner posts it."""
    sweep, _, label = point_key.partition(":")
    axis, _, value = label.partition("=")
    kind = "hf-sequential" if backend.startswith("hf") else "vllm"
    body: dict[str, Any] = {
        "backend": backend,
        "backend_kind": kind,
        "point": {
            "key": point_key,
            "sweep": sweep,
            "axis": axis or None,
            "value": float(value) if value else None,
            "input_len": 64,
            "output_len": 16,
            "max_concurrency": int(float(value)) if value else 1,
            "num_prompts": 8,
        },
        "repeat": repeat,
        "status": status,
        "error": None if status == "succeeded" else "server crashed",
        "metrics": {
            "request_throughput": 3.5,
            "output_throughput": 56.0,
            "total_token_throughput": 280.0,
            "mean_ttft_ms": 12.5,
            "median_ttft_ms": 11.0,
            "p90_ttft_ms": 20.0,
            "p99_ttft_ms": 30.0,
            "mean_tpot_ms": 4.0,
            "median_tpot_ms": 3.9,
            "p99_tpot_ms": 6.0,
        }
        if status == "succeeded"
        else {},
        "server_metrics": {"preemptions": 0.0, "kv_cache_usage_peak": 0.25, "samples": 3},
        "gpu_memory_peak_bytes": None,
        "commands": {"bench": "python -m vllm ... bench"},
        "raw": {"completed": 8},
        "detail": {"ttfts": [0.01] * 8},
        "started_at": "2026-11-30T06:00:00.000+00:00",
        "finished_at": "2026-11-30T06:00:05.000+00:00",
        "duration_s": 5.0,
    }
    body.update(overrides)
    return body


@pytest.fixture
def measurement() -> Callable[..., dict[str, Any]]:
    return measurement_body


# --------------------------------------------------------------------------- clients


@dataclass
class Persona:
    name: str
    user: Any
    client: Any
    token: str | None = None


@pytest.fixture
def bearer_client() -> Callable[[str | None], Any]:
    from django.test import Client

    def make(token: str | None) -> Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return Client(headers=headers)

    return make


@pytest.fixture
def personas(
    make_user: Callable[..., Any], bearer_client: Callable[..., Any]
) -> dict[str, Persona]:
    """owner, other (a signed-up user who does not own the run) and anon, with API clients
    that authenticate with real CI tokens."""
    from portal.accounts.tokens import create_user_token

    owner = make_user("owner")
    other = make_user("other")
    owner_token = create_user_token(owner, "tests").plaintext
    other_token = create_user_token(other, "tests").plaintext
    return {
        "owner": Persona("owner", owner, bearer_client(owner_token), owner_token),
        "other": Persona("other", other, bearer_client(other_token), other_token),
        "anon": Persona("anon", None, bearer_client(None)),
    }


# --------------------------------------------------------------------------- processes


def database_url_for_tests() -> str:
    """DATABASE_URL of the *test* database, for processes we start (worker, runner)."""
    from django.db import connection

    s = connection.settings_dict
    auth = quote(s["USER"] or "", safe="")
    if s["PASSWORD"]:
        auth += ":" + quote(s["PASSWORD"], safe="")
    options = dict(s.get("OPTIONS") or {})
    host = s["HOST"] or ""
    if host.startswith("/"):
        options["host"] = host
        netloc = f"{auth}@" if auth else ""
    else:
        netloc = f"{auth}@{host}" if auth else host
        if s["PORT"]:
            netloc += f":{s['PORT']}"
    query = "&".join(f"{k}={quote(str(v), safe='/')}" for k, v in options.items())
    return f"postgresql://{netloc}/{s['NAME']}" + (f"?{query}" if query else "")


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _stop(proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def celery_worker(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start a real ``celery -A portal.celery worker`` (optionally with beat, ``-B``)
    against the real broker and this session's test database."""
    started: list[WorkerProcess] = []

    def start(
        public_url: str = "http://testserver",
        beat: bool = False,
        reconcile_seconds: int = 15,
        extra_env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=database_url_for_tests(),
            SERVEBENCH_PUBLIC_URL=public_url,
            SERVEBENCH_RECONCILE_SECONDS=str(reconcile_seconds),
            SERVEBENCH_DB_CONN_MAX_AGE="0",
            PYTHONUNBUFFERED="1",
        )
        env.update(extra_env or {})
        log = tmp_path / f"worker-{len(started)}.log"
        cmd = [
            sys.executable, "-m", "celery", "-A", "portal.celery", "worker",
            "--loglevel", "INFO", "--concurrency", "1", "--pool", "prefork",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"test-{_SESSION}-{len(started)}@%h",
            "-Q", env["SERVEBENCH_QUEUE"],
        ]  # fmt: skip
        if beat:
            cmd += ["--beat", "--schedule", str(tmp_path / f"celerybeat-schedule-{len(started)}")]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        worker = WorkerProcess(proc, log)
        started.append(worker)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"the celery worker exited early:\n{worker.output()}")
            if " ready." in worker.output():
                return worker
            time.sleep(0.2)
        raise AssertionError(f"the celery worker did not become ready:\n{worker.output()}")

    yield start
    for worker in started:
        _stop(worker.proc)


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.25
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture
def waiter() -> Callable[..., Any]:
    return wait_for
