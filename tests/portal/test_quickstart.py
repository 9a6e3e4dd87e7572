"""`make run` (scripts/quickstart.py) for real, in a home of its own with embedded
PostgreSQL and Redis: it says how to sign in at once, serves the project's error pages,
and Ctrl-C or `make stop` (``--stop``) stops everything it started, a running benchmark
included (minutes: it migrates, collects static files and starts gunicorn and Celery);
and how it shares the machine's cores between the portal and the benchmark."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "quickstart.py"
# Its slow tests assert nothing a busy CPU changes: make test runs them beside others.
pytestmark = [pytest.mark.timeout(900), pytest.mark.shares_cpu]


@dataclass
class Quickstart:
    proc: subprocess.Popen[str]
    home: Path
    log: Path
    url: str

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output())
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise AssertionError(f"no {pattern!r} in the quickstart's output:\n{self.output()}")

    def state(self) -> dict:
        return json.loads((self.home / "dev" / "quickstart.json").read_text())

    def env(self) -> dict[str, str]:
        return quickstart_env(self.home)


def quickstart_env(home: Path) -> dict[str, str]:
    """A user's shell: no DATABASE_URL/REDIS_URL (embedded services), none of the test
    session's settings, everything under ``home``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SERVEBENCH_")
        and k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "SECRET_KEY")
    }
    env.update(SERVEBENCH_HOME=str(home), SERVEBENCH_CACHE=str(home))
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Quickstarts:
    """``start(*args)``: `make run` in a home of its own; ``clean()`` stops whatever a
    failed test left (the script's own stop, then the rest) and removes the homes."""

    def __init__(self) -> None:
        self.started: list[Quickstart] = []

    def start(self, *args: str) -> Quickstart:
        home = Path(tempfile.mkdtemp(prefix="sbqs-"))
        home.chmod(0o755)  # the embedded PostgreSQL runs as its own user when we are root
        port = free_port()
        log = home / "quickstart.out"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, str(SCRIPT), "--port", str(port), *args],
                cwd=REPO, env=quickstart_env(home), stdout=out, stderr=subprocess.STDOUT,
                text=True,
            )  # fmt: skip
        qs = Quickstart(proc, home, log, f"http://127.0.0.1:{port}")
        self.started.append(qs)
        return qs

    def clean(self) -> None:
        for qs in self.started:
            if qs.proc.poll() is None:
                subprocess.run([sys.executable, str(SCRIPT), "--stop"], env=qs.env(), timeout=120)
            leftovers(qs.home, kill=True)
            shutil.rmtree(qs.home, ignore_errors=True)


@pytest.fixture
def quickstart() -> Iterator[Callable[..., Quickstart]]:
    started = Quickstarts()
    yield started.start
    started.clean()


@pytest.fixture(scope="module")
def serving() -> Iterator[Quickstart]:
    """One `make run --no-demo` (minutes: it migrates, collects static files, starts
    gunicorn and Celery) for the two tests that need it up: the dead-worker test uses it,
    then the Ctrl-C test, last in the module, stops it."""
    started = Quickstarts()
    try:
        yield started.start("--no-demo")
    finally:
        started.clean()


def leftovers(home: Path, kill: bool = False) -> list[str]:
    """Processes still running anything under ``home`` (runners, PostgreSQL, Redis)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
        except psutil.Error:
            continue
        if str(home) in line and proc.pid != os.getpid():
            found.append(f"{proc.pid} {line[:160]}")
            if kill:
                proc.kill()
    return found


def gone(pids: list[int], timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        time.sleep(0.2)
    return alive


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - our test portal
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.slow
def test_make_stop_stops_the_demo_run_and_everything_else(
    quickstart: Callable[..., Quickstart],
) -> None:
    qs = quickstart()
    creds = qs.wait_for(r"sign in as (\S+) / (\S+) ", 400)
    token = qs.wait_for(r"API token for curl and the servebench CLI: (sb_ci_\S+)", 5).group(1)
    qs.wait_for(r"submitted the demo run", 300)
    out = qs.output()
    # How to sign in comes before the demo is even submitted, let alone finished.
    assert out.index("sign in as") < out.index("submitted the demo run")
    assert creds.group(1) == "demo"
    qs.wait_for(r"demo run: running", 300)
    state = qs.state()
    children = [c["pid"] for c in state["children"]]
    assert sorted(c["name"] for c in state["children"]) == ["beat", "web", "worker"]
    assert state["services"] == ["postgres", "redis"]
    runners = [line for line in leftovers(qs.home) if " -m runners run " in line]
    assert runners, leftovers(qs.home)
    assert token.startswith("sb_ci_")

    stop = subprocess.run(
        [sys.executable, str(SCRIPT), "--stop"], env=qs.env(), capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert qs.proc.wait(timeout=60) == 0
    assert "cancelled 1 active run(s)" in qs.output()
    assert gone([qs.proc.pid, *children]) == []
    assert leftovers(qs.home) == []  # no runner, vLLM, PostgreSQL or Redis left
    assert not (qs.home / "dev" / "quickstart.json").exists()
    again = subprocess.run(
        [sys.executable, str(SCRIPT), "--stop"], env=qs.env(), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert "nothing to stop" in again.stdout


def load_quickstart() -> Any:
    spec = importlib.util.spec_from_file_location("servebench_quickstart", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_runner_gets_its_own_cores_only_where_there_are_more_than_two() -> None:
    qs = load_quickstart()
    env: dict[str, str] = {}
    portal, note = qs.split_cores(env, [0, 1, 2, 3, 4, 5, 6, 7])
    assert portal == {0} and env["SERVEBENCH_CPUS"] == "1-7"
    assert "benchmarks own CPUs 1-7" in note and "CPU 0" in note
    env = {}
    portal, note = qs.split_cores(env, [4, 5])
    assert portal is None and "SERVEBENCH_CPUS" not in env and "share" in note
    env = {"SERVEBENCH_CPUS": "2-3"}  # the user's choice stands
    portal, note = qs.split_cores(env, list(range(8)))
    assert portal is None and env["SERVEBENCH_CPUS"] == "2-3" and "(yours)" in note


def test_when_the_services_cannot_start_it_says_why_and_leaves_nothing(
    quickstart: Callable[..., Quickstart],
) -> None:
    qs = quickstart("--no-demo")
    (qs.home / "dev").mkdir(exist_ok=True)
    (qs.home / "dev" / "redis").write_text("a file where the Redis directory belongs")
    assert qs.proc.wait(timeout=180) != 0
    out = qs.output()
    assert "the embedded PostgreSQL and Redis did not start: could not start the embedded" in out
    assert "FileExistsError" in out and "CalledProcessError" not in out
    assert "Next: see the services' logs under" in out
    assert leftovers(qs.home) == []  # the PostgreSQL it had started is stopped again


@pytest.mark.slow
def test_a_dead_worker_is_restarted_and_the_run_goes_on(
    serving: Quickstart, tiny_model: Path
) -> None:
    # The model make run builds under its home (the portal's allowed model roots).
    qs = serving
    token = qs.wait_for(r"API token for curl and the servebench CLI: (sb_ci_\S+)", 400).group(1)
    qs.wait_for(r"Ctrl-C \(or `make stop` in another shell\) stops everything", 60)
    spec = {
        "name": "survives a worker crash",
        "model": {"id": str(qs.home / tiny_model.name), "max_model_len": 512},
        "workload": {"input_len": 32, "output_len": 32, "num_prompts": 4},
        "backends": [{"kind": "hf-sequential", "num_prompts": 64}],
        "resources": {"gpu_count": 0, "timeout_minutes": 10},
    }
    qs_module = load_quickstart()
    run = qs_module.http(f"{qs.url}/api/v1/runs/", token, {"spec": spec})

    def status() -> str:
        return qs_module.http(f"{qs.url}/api/v1/runs/{run['id']}/", token)["status"]

    deadline = time.monotonic() + 300
    while status() != "running":
        assert time.monotonic() < deadline, qs.output()
        time.sleep(1)
    worker = next(c["pid"] for c in qs.state()["children"] if c["name"] == "worker")
    os.killpg(worker, signal.SIGKILL)
    qs.wait_for(r"the worker process was killed by signal SIGKILL \(9\); restarting it", 30)
    assert gone([worker]) == []
    new = next(c["pid"] for c in qs.state()["children"] if c["name"] == "worker")
    assert new != worker and psutil.pid_exists(new)
    deadline = time.monotonic() + 600
    while (now := status()) not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, qs.output()
        time.sleep(2)
    assert now == "succeeded", qs_module.http(f"{qs.url}/api/v1/runs/{run['id']}/", token)
    assert qs.proc.poll() is None  # still serving (the Ctrl-C test below stops it)


@pytest.mark.slow
def test_ctrl_c_stops_everything_and_pages_are_the_projects_own(serving: Quickstart) -> None:
    """Last in the module: it stops the quickstart the dead-worker test used."""
    qs = serving
    qs.wait_for(r"Ctrl-C \(or `make stop` in another shell\) stops everything", 400)
    status, page = get(f"{qs.url}/runs/zzzz1234/")
    assert status == 404 and 'id="not-found"' in page and "Traceback" not in page
    assert "No run id that you can see starts with" in page
    status, presets = get(f"{qs.url}/api/v1/presets/")
    assert [p["name"] for p in json.loads(presets)] == ["seed", "seed-all-baselines", "tiny-demo"]
    children = [c["pid"] for c in qs.state()["children"]]

    qs.proc.send_signal(signal.SIGINT)
    assert qs.proc.wait(timeout=120) == 0
    assert "stopped the embedded PostgreSQL" in qs.output()
    assert gone(children) == []
    assert leftovers(qs.home) == []
