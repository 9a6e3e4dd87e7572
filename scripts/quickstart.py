"""`make run`: the portal with a finished demo benchmark, on one machine.

1. Databases: DATABASE_URL / REDIS_URL when set; otherwise embedded PostgreSQL and Redis
   from pip wheels (``portal.devservices``), kept under $SERVEBENCH_HOME/dev.
2. migrate, static files, a demo user, the tiny model (built offline).
3. web (gunicorn), a Celery worker and Celery beat, as child processes; then at once the
   URL, the demo user's password and an API token, so you can sign in and watch.
4. A demo run on the tiny model (the ``tiny-demo`` preset: HF baseline + vLLM's CPU build)
   through the REST API, the way a CI job submits; its progress until it finishes.
5. Everything keeps running until Ctrl-C (or ``make stop`` from another shell), which
   stops what this started: active runs' runners, beat, worker, web, and the embedded
   PostgreSQL and Redis (unless they were running before, e.g. for the test suite).

Run it again and it reuses the finished demo run (``--new-demo`` submits another).

Cores: on a machine with more than 2 CPUs the benchmark runner owns all but the first
(``SERVEBENCH_CPUS``, which runners honour), and web, beat, PostgreSQL and Redis are pinned
to the first, so serving the live page does not disturb what is measured. With 2 CPUs or
fewer, splitting would halve the benchmark, so they share, and each measurement records
the contention it saw (its ``conditions``). A SERVEBENCH_CPUS you set is kept as it is.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # runners/ and portal/: this file lives in scripts/
PY = sys.executable
DEMO_NAME = "Tiny model demo (CPU)"
STATE_NAME = "quickstart.json"  # under $SERVEBENCH_HOME/dev: what `make stop` stops
STOP_TIMEOUT_S = 60.0


def say(msg: str) -> None:
    print(f"servebench: {msg}", flush=True)


def home_dir() -> Path:
    """$SERVEBENCH_HOME, as the portal's settings and portal.devservices read it."""
    root = os.environ.get("SERVEBENCH_HOME") or os.environ.get("SERVEBENCH_CACHE")
    return Path(root or Path.home() / ".cache" / "servebench").expanduser()


# --------------------------------------------------------------------------- processes


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _same_process(pid: int, created: float | None) -> bool:
    """Whether ``pid`` is still the process recorded (not a later one with a reused pid)."""
    now = _create_time(pid)
    return now is not None and created is not None and abs(now - created) < 0.01


def _stop_group(pid: int, created: float | None, timeout: float) -> None:
    """SIGTERM the process group ``pid`` leads, SIGKILL it after ``timeout``."""
    if not _same_process(pid, created):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _same_process(pid, created):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it if it is ours
        time.sleep(0.1)
    if _same_process(pid, created):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


class Stack:
    """What this quickstart started, stopped in reverse order on Ctrl-C or ``make stop``;
    recorded in ``state_path`` so ``--stop`` finds it from another shell."""

    def __init__(self, env: dict[str, str], dev: Path, base: str):
        self.env = env
        self.dev = dev
        self.logs = dev / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.base = base
        self.state_path = dev / STATE_NAME
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.services: list[str] = []  # embedded services this quickstart started
        self.embedded_urls: dict[str, str] = {}
        self.save()

    def save(self) -> None:
        state = {
            "pid": os.getpid(),
            "created": _create_time(os.getpid()),
            "url": self.base,
            "children": [
                {"name": name, "pid": p.pid, "created": _create_time(p.pid)}
                for name, p in self.procs
            ],
            "services": self.services,
            # The embedded services' socket URLs (no credentials), for stopping runs if
            # this process died; with your own DATABASE_URL, `make stop` reads yours.
            "env": self.embedded_urls,
        }
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2), encoding="utf-8")
        tmp.chmod(0o600)
        tmp.replace(self.state_path)

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

    def start(self, name: str, argv: list[str], cpus: set[int] | None = None) -> None:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the child
        preexec: Callable[[], None] | None = None
        if cpus is not None:

            def preexec() -> None:
                os.sched_setaffinity(0, cpus)

        proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=preexec,
        )  # fmt: skip
        self.procs.append((name, proc))
        self.save()

    def check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise SystemExit(
                    f"servebench: the {name} process exited with code {proc.returncode}.\n"
                    f"Last lines of {self.logs / (name + '.log')}:\n{tail}"
                )

    def stop(self) -> None:
        """Runners of active runs first (while the portal can still take their last
        report), then beat, worker, web, then the embedded services this started."""
        if self.procs:  # the database was up and migrated: runs may be active
            stop_runs(self.env)
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.time() + 20
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        stop_services(self.services, self.dev.parent)
        self.state_path.unlink(missing_ok=True)


def stop_runs(env: dict[str, str]) -> None:
    """Cancel the runs still active and stop their runners (``--stop-runs`` in a child with
    the portal's environment): a benchmark left behind would hold the cores and report to
    a portal that is gone."""
    out = subprocess.run(
        [PY, __file__, "--stop-runs"],
        cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if out.stdout.strip():
        say(out.stdout.strip())
    if out.returncode != 0:
        say(f"could not stop the active runs: {out.stderr.strip()[-500:]}")


def _stop_runs_here() -> int:
    """``--stop-runs``: cancel every active run, stopping its runner now (not through the
    worker, which is about to stop)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from portal.benchmarks import lifecycle
    from portal.benchmarks.models import ACTIVE_STATUSES, Run
    from portal.dispatch import dispatcher

    runs = list(Run.objects.filter(status__in=ACTIVE_STATUSES))
    for run in runs:
        lifecycle.cancel_run(run)
        dispatcher.stop_run(run.pk)
    if runs:
        print(f"cancelled {len(runs)} active run(s): {', '.join(r.short_id for r in runs)}")
    return 0


def stop_services(started: list[str], home: Path) -> None:
    if not started:
        return
    from portal import devservices

    dev = home / "dev"
    if "postgres" in started and devservices.stop_postgres(dev):
        say("stopped the embedded PostgreSQL")
    if "redis" in started and devservices.stop_redis(dev):
        say("stopped the embedded Redis")


def services_env(env: dict[str, str], dev: Path, cpus: set[int] | None) -> list[str]:
    """Fill DATABASE_URL / REDIS_URL from the embedded services when they are unset; the
    services this call started (not the ones already running)."""
    from portal import devservices

    if env.get("DATABASE_URL") and env.get("REDIS_URL"):
        say("using DATABASE_URL and REDIS_URL from the environment")
        return []
    wanted = [
        name
        for name, key in (("postgres", "DATABASE_URL"), ("redis", "REDIS_URL"))
        if not env.get(key)
    ]
    running = {
        "postgres": devservices.postgres_running(dev),
        "redis": devservices.redis_running(dev),
    }
    say("starting embedded PostgreSQL and Redis (set DATABASE_URL / REDIS_URL to use yours)")
    out = subprocess.run(
        [PY, "-m", "portal.devservices", "start", "--json", "--home", str(dev)],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )  # fmt: skip
    urls = json.loads(out.stdout)
    env.setdefault("DATABASE_URL", urls["DATABASE_URL"])
    env.setdefault("REDIS_URL", urls["REDIS_URL"])
    return [name for name in wanted if not running[name]]


# --------------------------------------------------------------------------- helpers


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


def split_cores(
    env: dict[str, str], allowed: list[int] | None = None
) -> tuple[set[int] | None, str]:
    """(the CPUs the portal's own processes are pinned to, or None; what was chosen).
    ``allowed``: the CPUs this process may use (default: its affinity)."""
    from runners import conditions

    allowed = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    if env.get(conditions.CPUS_ENV):
        return None, f"benchmarks run on SERVEBENCH_CPUS={env[conditions.CPUS_ENV]} (yours)"
    if len(allowed) <= 2:
        return None, (
            f"{len(allowed)} CPUs: the portal and the benchmark share them (each "
            "measurement records any contention); with more than 2 the runner gets its own"
        )
    portal, runner = {allowed[0]}, allowed[1:]
    env[conditions.CPUS_ENV] = conditions.format_cpu_list(runner)
    return portal, (
        f"benchmarks own CPUs {env[conditions.CPUS_ENV]} (SERVEBENCH_CPUS); web, beat, "
        f"PostgreSQL and Redis run on CPU {allowed[0]}"
    )


def banner(base: str, creds: dict[str, Any], demo_url: str | None) -> None:
    lines = [
        f"  servebench is running at {base}/",
        f"  sign in as {creds['username']} / {creds['password']}  ({base}/login/)",
        f"  API token for curl and the servebench CLI: {creds['token']}"
        + ("  (the same as the last start)" if creds.get("kept") else "  (new)"),
        f"    export SERVEBENCH_URL={base} SERVEBENCH_TOKEN={creds['token']}",
        f"  new run from the form: {base}/runs/new/ (the tiny demo preset runs here)",
    ]
    if demo_url:
        lines.append(f"  demo run (permalink): {demo_url}")
    lines.append("  Ctrl-C (or `make stop` in another shell) stops everything.")
    print("\n" + "\n".join(lines) + "\n", flush=True)


# --------------------------------------------------------------------------- stop


def read_state(dev: Path) -> dict[str, Any] | None:
    try:
        return json.loads((dev / STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def stop_other(dev: Path) -> int:
    """``--stop`` (``make stop``): stop the quickstart of this SERVEBENCH_HOME, or what it
    left behind if it died without cleaning up."""
    state = read_state(dev)
    if state is None:
        say("nothing to stop: no `make run` is running here")
        return 0
    pid, created = int(state["pid"]), state.get("created")
    if _same_process(pid, created):
        say(f"stopping `make run` (pid {pid}) at {state.get('url', '')}")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and _same_process(pid, created):
            time.sleep(0.2)
        if not _same_process(pid, created):
            say("stopped")
            return 0
        say(f"`make run` (pid {pid}) did not stop in {STOP_TIMEOUT_S:.0f} s; stopping its parts")
    else:
        say("`make run` is gone; stopping what it left behind")
    env = {
        **os.environ,
        "SERVEBENCH_QUICKSTART": "1",  # the portal's settings as `make run` had them
        "SERVEBENCH_HOME": str(dev.parent),
        **state.get("env", {}),
    }
    if state.get("children"):
        stop_runs(env)
    for child in reversed(state.get("children", [])):
        _stop_group(int(child["pid"]), child.get("created"), 15.0)
    stop_services(list(state.get("services", [])), dev.parent)
    (dev / STATE_NAME).unlink(missing_ok=True)
    say("stopped")
    return 0


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("SERVEBENCH_PORT", 8000)))
    parser.add_argument("--new-demo", action="store_true", help="submit a fresh demo run")
    parser.add_argument("--no-demo", action="store_true", help="start the portal only")
    parser.add_argument(
        "--exit-when-done", action="store_true", help="stop everything once the demo finished"
    )
    parser.add_argument("--stop", action="store_true", help="stop a running `make run` (make stop)")
    parser.add_argument("--stop-runs", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    home = home_dir()
    dev = home / "dev"
    if args.stop_runs:
        return _stop_runs_here()
    if args.stop:
        return stop_other(dev)
    state = read_state(dev)
    if state and _same_process(int(state["pid"]), state.get("created")):
        say(f"`make run` is already running at {state.get('url')} (pid {state['pid']}); "
            "`make stop` stops it")  # fmt: skip
        return 1

    base = f"http://127.0.0.1:{args.port}"
    env = dict(os.environ)
    env.setdefault("SERVEBENCH_HOME", str(home))
    portal_cpus, cores_note = split_cores(env)
    if portal_cpus:
        # This process too (it polls the demo); the worker gets every CPU back, so the
        # runners it starts can own theirs.
        everything = os.sched_getaffinity(0)
        os.sched_setaffinity(0, portal_cpus)
    # Development mode without DEBUG: the project's own 404/500 pages, never Django's
    # debug page (createdemo and the generated SECRET_KEY only need QUICKSTART).
    env["SERVEBENCH_QUICKSTART"] = "1"
    env.setdefault("DEBUG", "0")
    env.setdefault("SERVEBENCH_PAGE_CACHE", "redis")  # the demo's page is warm at first visit
    dev.mkdir(parents=True, exist_ok=True)
    env.setdefault("SECRET_KEY", secret_key(dev))
    env.setdefault("SERVEBENCH_PUBLIC_URL", base)
    env.setdefault("SERVEBENCH_DATA_DIR", str(dev / "runs"))
    env.setdefault("SERVEBENCH_STATIC_ROOT", str(dev / "static"))
    env.setdefault("SERVEBENCH_RUNNER_PYTHON", PY)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    from runners import tiny_model

    model_dir = home / tiny_model.default_dir().name  # under SERVEBENCH_MODEL_ROOTS (home)
    env.setdefault("SERVEBENCH_TINY_MODEL_DIR", str(model_dir))

    stack = Stack(env, dev, base)
    signal.signal(signal.SIGTERM, _interrupt)  # `make stop`: the same clean stop as Ctrl-C
    # Ctrl-C stops everything even when started from a shell that ignores SIGINT.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        own = {k: v for k, v in env.items() if k in ("DATABASE_URL", "REDIS_URL")}
        stack.services = services_env(env, dev, portal_cpus)
        stack.embedded_urls = {
            k: env[k] for k in ("DATABASE_URL", "REDIS_URL") if k in env and k not in own
        }
        stack.save()
        say(f"cores: {cores_note}")
        say("migrating the database")
        stack.manage("migrate", "--no-input")
        say("collecting static files")
        stack.manage("collectstatic", "--no-input", "--verbosity", "0")
        creds = json.loads(stack.manage("createdemo", "--json", capture=True))
        if not (model_dir / "config.json").exists():
            say(f"building the tiny demo model in {model_dir}")
            subprocess.run(
                [PY, "-m", "runners", "tiny-model", str(model_dir)], check=True, cwd=ROOT
            )

        say(f"starting web ({base}), worker and beat; logs in {stack.logs}")
        stack.start(
            "web",
            [PY, "-m", "gunicorn", "portal.wsgi", "--bind", f"127.0.0.1:{args.port}",
             "--workers", "2", "--threads", "4", "--access-logfile", "-"],
            portal_cpus,
        )  # fmt: skip
        stack.start(
            "worker",
            [PY, "-m", "celery", "-A", "portal.celery", "worker", "--loglevel", "INFO",
             "--concurrency", "2", "--without-gossip", "--without-mingle"],
            everything if portal_cpus else None,
        )  # fmt: skip
        stack.start(
            "beat",
            [PY, "-m", "celery", "-A", "portal.celery", "beat", "--loglevel", "INFO",
             "--schedule", str(dev / "celerybeat-schedule")],
            portal_cpus,
        )  # fmt: skip
        wait_healthy(stack, base)
        token = creds["token"]
        banner(base, creds, None)  # sign in now and watch the demo run live
        if args.no_demo:
            return wait_forever(stack)

        run = None
        if not args.new_demo:
            found = http(f"{base}/api/v1/runs/?owner=me&status=succeeded", token)
            run = next((r for r in found["results"] if r["name"] == DEMO_NAME), None)
        if run is None:
            run = http(f"{base}/api/v1/runs/", token, {"preset": "tiny-demo", "is_public": True})
            say(
                f"submitted the demo run {run['id'][:8]}: HF baseline + vLLM on CPU (~5 min "
                "on 2 idle cores; longer with other work on the machine)"
            )
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
            reason = (state.get("failure_reason") or "").splitlines()[:1]
            say(f"the demo run {state['status']}: {reason[0] if reason else ''}")
            say(f"runner logs: {env['SERVEBENCH_DATA_DIR']}")
        banner(base, creds, url)
        if args.exit_when_done:
            return 0 if state["status"] == "succeeded" else 1
        return wait_forever(stack)
    except KeyboardInterrupt:
        return 0
    finally:
        # A second Ctrl-C must not cut the clean-up short: it is bounded by timeouts.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say("stopping")
        stack.stop()
        say("stopped")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def wait_forever(stack: Stack) -> int:
    while True:
        stack.check_alive()
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
