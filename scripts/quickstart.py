"""`make run`: the portal with a finished demo benchmark, on one machine.

1. Databases: DATABASE_URL / REDIS_URL when set; otherwise embedded PostgreSQL and Redis
   from pip wheels (``portal.devservices``), kept under ~/.cache/servebench/dev.
2. migrate, a demo user, the tiny model (built offline).
3. web (gunicorn), a Celery worker and Celery beat, as child processes.
4. A demo run on the tiny model (HF baseline + vLLM CPU build) through the REST API, the
   way a CI job submits; its progress is printed until it finishes, then its permalink.
5. Everything keeps running until Ctrl-C, which stops all of it.

Run it again and it reuses the finished demo run (``--new-demo`` submits another).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runners/ for the demo spec; this file lives in scripts/
PY = sys.executable
DEMO_NAME = "Tiny model demo (CPU)"


def say(msg: str) -> None:
    print(f"servebench: {msg}", flush=True)


def cache_dir() -> Path:
    return Path(os.environ.get("SERVEBENCH_CACHE", Path.home() / ".cache" / "servebench"))


class Stack:
    """The child processes, stopped together (process groups) on exit or Ctrl-C."""

    def __init__(self, env: dict[str, str], logs: Path):
        self.env = env
        self.logs = logs
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def manage(self, *args: str, capture: bool = False) -> str:
        out = subprocess.run(
            [PY, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            check=False,
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            sys.stderr.write(out.stdout + out.stderr)
            raise SystemExit(f"servebench: 'manage.py {' '.join(args)}' failed (see above)")
        return out.stdout if capture else ""

    def start(self, name: str, argv: list[str]) -> None:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the child
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.procs.append((name, proc))

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise SystemExit(
                    f"servebench: the {name} process exited with code {proc.returncode}.\n"
                    f"Last lines of {self.logs / (name + '.log')}:\n{tail}"
                )

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.time() + 15
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def services_env(env: dict[str, str]) -> None:
    """Fill DATABASE_URL / REDIS_URL from the embedded services when they are unset."""
    if env.get("DATABASE_URL") and env.get("REDIS_URL"):
        say("using DATABASE_URL and REDIS_URL from the environment")
        return
    say("starting embedded PostgreSQL and Redis (set DATABASE_URL / REDIS_URL to use yours)")
    out = subprocess.run(
        [PY, "-m", "portal.devservices", "start", "--json"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    urls = json.loads(out.stdout)
    env.setdefault("DATABASE_URL", urls["DATABASE_URL"])
    env.setdefault("REDIS_URL", urls["REDIS_URL"])


def secret_key(dev: Path) -> str:
    path = dev / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


def http(url: str, token: str, body: dict | None = None) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    method = "POST" if body is not None else "GET"
    req = urllib.request.Request(url, data=data, method=method)  # noqa: S310 - our local portal
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - our own local portal
        return json.loads(resp.read())


def wait_healthy(stack: Stack, base: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        stack.check_alive()
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:  # noqa: S310
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    raise SystemExit(f"servebench: the portal did not answer {base}/healthz in {timeout:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("SERVEBENCH_PORT", 8000)))
    parser.add_argument("--new-demo", action="store_true", help="submit a fresh demo run")
    parser.add_argument(
        "--exit-when-done", action="store_true", help="stop everything once the demo finished"
    )
    args = parser.parse_args()

    dev = cache_dir() / "dev"
    logs = dev / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{args.port}"
    env = dict(os.environ)
    services_env(env)
    env.setdefault("DEBUG", "1")
    env.setdefault("SECRET_KEY", secret_key(dev))
    env.setdefault("SERVEBENCH_PUBLIC_URL", base)
    env.setdefault("SERVEBENCH_DATA_DIR", str(dev / "runs"))
    env.setdefault("SERVEBENCH_RUNNER_PYTHON", PY)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")

    stack = Stack(env, logs)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Ctrl-C stops everything even when started from a shell that ignores SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        say("migrating the database")
        stack.manage("migrate", "--no-input")
        creds = json.loads(stack.manage("createdemo", "--json", capture=True))
        model_dir = cache_dir() / "tiny-model-v1"
        if not (model_dir / "config.json").exists():
            say(f"building the tiny demo model in {model_dir}")
            subprocess.run(
                [PY, "-m", "runners", "tiny-model", str(model_dir)], check=True, cwd=ROOT
            )

        say(f"starting web ({base}), worker and beat; logs in {logs}")
        stack.start(
            "web",
            [PY, "-m", "gunicorn", "portal.wsgi", "--bind", f"127.0.0.1:{args.port}",
             "--workers", "2", "--threads", "4", "--access-logfile", "-"],
        )  # fmt: skip
        stack.start(
            "worker",
            [PY, "-m", "celery", "-A", "portal.celery", "worker", "--loglevel", "INFO",
             "--concurrency", "2", "--without-gossip", "--without-mingle"],
        )  # fmt: skip
        stack.start(
            "beat",
            [PY, "-m", "celery", "-A", "portal.celery", "beat", "--loglevel", "INFO",
             "--schedule", str(dev / "celerybeat-schedule")],
        )  # fmt: skip
        wait_healthy(stack, base)

        token = creds["token"]
        run = None
        if not args.new_demo:
            found = http(f"{base}/api/v1/runs/?owner=me&status=succeeded", token)
            run = next((r for r in found["results"] if r["name"] == DEMO_NAME), None)
        if run is None:
            from runners.spec import dump_spec, tiny_demo

            spec = json.loads(dump_spec(tiny_demo(str(model_dir)), "json"))
            run = http(f"{base}/api/v1/runs/", token, {"spec": spec, "is_public": True})
            say(f"submitted the demo run {run['id'][:8]}: HF baseline + vLLM on CPU (~5 min)")
        url = f"{base}/runs/{run['id']}/"
        say(f"watch it live at {url}")

        last = None
        while True:
            stack.check_alive()
            state = http(f"{base}/api/v1/runs/{run['id']}/", token)
            line = f"{state['status']} {state['progress']['done']}/{state['progress']['total']}"
            if line != last:
                say(f"demo run: {line}")
                last = line
            if state["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(3)
        if state["status"] != "succeeded":
            say(f"the demo run {state['status']}: {state.get('failure_reason') or ''}")
            say(f"runner logs: {env['SERVEBENCH_DATA_DIR']}")
        print(
            "\n"
            f"  servebench is running at {base}/\n"
            f"  demo run (permalink): {url}\n"
            f"  sign in as {creds['username']} / {creds['password']}\n"
            f"  API token for curl: {token}\n"
            "  Ctrl-C stops everything.\n",
            flush=True,
        )
        if args.exit_when_done:
            return 0 if state["status"] == "succeeded" else 1
        while True:
            stack.check_alive()
            time.sleep(2)
    except KeyboardInterrupt:
        say("stopping")
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
