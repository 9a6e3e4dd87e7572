"""``make test``'s suite phase: the pytest sessions, grouped so that what mostly waits runs
beside what computes.

On a 2-core machine the suite's minutes go to two kinds of test:

- ``tests/k8s_e2e`` (the chart on a real one-node cluster) mostly waits: for Pods to be
  scheduled, containers to start, probes, Jobs and their controllers;
- the tests marked ``slow`` (vLLM servers, the runner, the whole stack) keep both cores
  busy, and some of them judge what they measure (a flag that slows a server, an SLO
  search, the contention a run saw), so nothing may run beside them.

So the suite runs as three sessions in two stages:

1. ``cluster`` (``tests/k8s_e2e``) and ``quiet`` (everything not marked ``slow``:
   the portal against PostgreSQL and Redis, the browser, the test control plane, the
   fast runner tests) at the same time;
2. ``heavy`` (everything marked ``slow`` outside ``tests/k8s_e2e``) alone.

Each session writes its own JUnit report (``suite-<group>.xml``) and its server-start
counts (``suite-<group>.starts.json``) under ``--reports``; the background session's
output goes to ``suite-<group>.log`` and is printed whole when it ends, so the log never
interleaves. Each group prints its time. The exit status is the first failing session's.
Sessions never collide: each has its own test database, Celery queue and temporary
directory (``tests/portal/conftest.py``) and the cluster has its own database.

``--one-session`` (what ``make test PYTEST_ARGS=...`` uses) runs one pytest session over
everything instead, with the arguments given, as before the groups existed.

    python scripts/suite.py [--reports DIR] [--one-session] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
E2E = "tests/k8s_e2e"


@dataclass(frozen=True)
class Group:
    name: str
    args: list[str] = field(default_factory=list)


# Stages run one after the other; the groups of a stage run at the same time, the first
# in the foreground (its output streams), the others in the background.
STAGES: list[list[Group]] = [
    [
        Group("quiet", ["-m", "not slow and not fuzz", f"--ignore={E2E}"]),
        Group("cluster", ["-m", "not fuzz", E2E]),
    ],
    [Group("heavy", ["-m", "slow and not fuzz", f"--ignore={E2E}"])],
]
ONE_SESSION = Group("suite", ["-m", "not fuzz"])


def command(group: Group, reports: Path, extra: list[str]) -> list[str]:
    """The pytest command line of a group's session."""
    return [
        sys.executable, "-m", "pytest", *group.args, "--durations=25",
        f"--junitxml={reports / f'suite-{group.name}.xml'}", *extra,
    ]  # fmt: skip


def _env(group: Group, reports: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SERVEBENCH_SERVER_STARTS": str(reports / f"suite-{group.name}.starts.json"),
    }


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s ({seconds / 60:.1f} min)"


def run_stage(stage: list[Group], reports: Path, extra: list[str], cwd: Path = REPO) -> int:
    """Runs the stage's groups at once (from ``cwd``); returns the first non-zero exit
    status, or 0."""
    started = time.monotonic()
    background: list[tuple[Group, subprocess.Popen[bytes], Path]] = []
    for group in stage[1:]:
        log = reports / f"suite-{group.name}.log"
        print(f"suite: group '{group.name}' started in the background (output: {log})", flush=True)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command(group, reports, extra), cwd=cwd, env=_env(group, reports),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        background.append((group, proc, log))
    first = stage[0]
    print(f"suite: group '{first.name}' started", flush=True)
    try:
        rc = subprocess.call(command(first, reports, extra), cwd=cwd, env=_env(first, reports))
    except KeyboardInterrupt:
        for _, proc, _ in background:
            proc.terminate()
        raise
    print(f"suite: group '{first.name}' took {_minutes(time.monotonic() - started)}", flush=True)
    codes = [rc]
    for group, proc, log in background:
        code = proc.wait()
        took = time.monotonic() - started
        print(f"\nsuite: ---- output of group '{group.name}' ({log}) ----", flush=True)
        sys.stdout.flush()
        with log.open("rb") as text:
            sys.stdout.buffer.write(text.read())
        sys.stdout.buffer.flush()
        print(f"suite: group '{group.name}' took {_minutes(took)} (exit {code})", flush=True)
        codes.append(code)
    return next((c for c in codes if c != 0), 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, default=REPO / "artifacts" / "test-reports")
    parser.add_argument("--one-session", action="store_true")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to every session")
    args = parser.parse_args(argv)
    reports: Path = args.reports.resolve()
    reports.mkdir(parents=True, exist_ok=True)
    for old in reports.glob("suite*"):  # a report left by an earlier run is not this one's
        old.unlink()
    stages = [[ONE_SESSION]] if args.one_session else STAGES
    rc = 0
    for stage in stages:
        code = run_stage(stage, reports, list(args.pytest_args))
        rc = rc or code
    return rc


if __name__ == "__main__":
    sys.exit(main())
