"""``make test``'s suite phase: the pytest sessions, grouped so that what mostly waits runs
beside what computes.

On a 2-core machine the suite's minutes go to three kinds of test:

- ``tests/k8s_e2e`` (the chart on a real one-node cluster) mostly waits: for Pods to be
  scheduled, containers to start, probes, Jobs and their controllers;
- most tests marked ``slow`` (vLLM servers, the runner, the whole CLI path) judge what
  they measure (a flag that slows a server, an SLO search, a trace the client keeps up
  with, the contention a run saw), so nothing may run beside them;
- the rest (the portal against PostgreSQL and Redis, the browser, the test control plane,
  the runner's fast tests, and the slow tests marked ``shares_cpu``, which assert nothing
  a busy CPU changes: ``make run`` itself, faults injected into a whole stack, the HF
  baselines' mechanics) only need to finish.

So the suite runs as five sessions in two stages:

1. at the same time, in two lanes: ``quiet`` (everything not marked ``slow`` nor
   ``fuzz``) in one; ``cluster`` (``tests/k8s_e2e``), then ``shared`` (``slow`` and
   ``shares_cpu``), then ``fuzz`` (Schemathesis and Hypothesis against the live test
   server, which judge answers, not time) in the other;
2. ``heavy`` (the other ``slow`` tests) alone.

Each session writes its own JUnit report (``suite-<group>.xml``) and its server-start
counts (``suite-<group>.starts.json``) under ``--reports``; a background lane's sessions
write their output to ``suite-<group>.log``, printed whole when the stage ends, so the log
never interleaves. Each group prints its time. The exit status is the first failing
session's; every session runs whatever an earlier one did. Sessions never collide: each
has its own test database, Celery queue and temporary directory
(``tests/portal/conftest.py``) and the cluster has its own database.

``--one-session`` (what ``make test PYTEST_ARGS=...`` uses) runs one pytest session over
everything but the fuzz tests instead, with the arguments given (``make test`` then runs
``make fuzz`` on its own), as before the groups existed.

    python scripts/suite.py [--reports DIR] [--one-session] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
E2E = "tests/k8s_e2e"
FUZZ = "tests/portal/test_api_fuzz.py"


@dataclass(frozen=True)
class Group:
    name: str
    args: list[str] = field(default_factory=list)


Lane = list[Group]  # sessions run one after the other
# Stages run one after the other; the lanes of a stage at the same time, the first in the
# foreground (its output streams), the others in the background.
STAGES: list[list[Lane]] = [
    [
        [Group("quiet", ["-m", "not slow and not fuzz", f"--ignore={E2E}"])],
        [
            Group("cluster", ["-m", "not fuzz", E2E]),
            Group("shared", ["-m", "slow and shares_cpu and not fuzz", f"--ignore={E2E}"]),
            Group("fuzz", ["-m", "fuzz", FUZZ]),
        ],
    ],
    [[Group("heavy", ["-m", "slow and not shares_cpu and not fuzz", f"--ignore={E2E}"])]],
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


@dataclass
class _Ran:
    group: Group
    log: Path | None  # None: its output went to ours
    code: int = -1
    seconds: float = 0.0


class _Lane(threading.Thread):
    """A lane: its sessions one after the other. In the foreground (``run()`` called
    directly) their output streams; in the background (``start()``) it goes to logs."""

    def __init__(
        self, lane: Lane, reports: Path, extra: list[str], cwd: Path, logged: bool
    ) -> None:
        super().__init__(daemon=True)
        self.lane, self.reports, self.extra, self.cwd = lane, reports, extra, cwd
        self.logged = logged
        self.ran: list[_Ran] = []
        self.current: subprocess.Popen[bytes] | None = None
        self.stopped = False

    def run(self) -> None:
        for group in self.lane:
            if self.stopped:
                return
            ran = _Ran(group, self.reports / f"suite-{group.name}.log" if self.logged else None)
            self.ran.append(ran)
            if not self.logged:
                print(f"suite: group '{group.name}' started", flush=True)
            began = time.monotonic()
            with ran.log.open("wb") if ran.log else contextlib.nullcontext() as out:
                self.current = subprocess.Popen(
                    command(group, self.reports, self.extra), cwd=self.cwd,
                    env=_env(group, self.reports), stdout=out,
                    stderr=subprocess.STDOUT if out else None,
                    stdin=subprocess.DEVNULL if out else None,
                )  # fmt: skip
                ran.code = self.current.wait()
            ran.seconds = time.monotonic() - began
            if not self.logged:
                print(f"suite: group '{group.name}' took {_took(ran)}", flush=True)

    def stop(self) -> None:
        self.stopped = True
        if self.current is not None:
            self.current.terminate()


def _took(ran: _Ran) -> str:
    return f"{_minutes(ran.seconds)} (exit {ran.code})"


def run_stage(stage: list[Lane], reports: Path, extra: list[str], cwd: Path = REPO) -> int:
    """Runs the stage's lanes at once (from ``cwd``); returns the first non-zero exit
    status, or 0."""
    foreground = _Lane(stage[0], reports, extra, cwd, logged=False)
    background = [_Lane(lane, reports, extra, cwd, logged=True) for lane in stage[1:]]
    for lane in background:
        names = " then ".join(f"'{g.name}'" for g in lane.lane)
        logs = ", ".join(str(reports / f"suite-{g.name}.log") for g in lane.lane)
        print(f"suite: {names} started in the background (output: {logs})", flush=True)
        lane.start()
    try:
        foreground.run()
        for lane in background:
            lane.join()
    except KeyboardInterrupt:
        for lane in [foreground, *background]:
            lane.stop()
        raise
    for lane in background:
        for ran in lane.ran:
            print(f"\nsuite: ---- output of group '{ran.group.name}' ({ran.log}) ----", flush=True)
            assert ran.log is not None
            with ran.log.open("rb") as text:
                sys.stdout.buffer.write(text.read())
            sys.stdout.buffer.flush()
            print(f"suite: group '{ran.group.name}' took {_took(ran)}", flush=True)
    codes = [ran.code for lane in [foreground, *background] for ran in lane.ran]
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
    stages = [[[ONE_SESSION]]] if args.one_session else STAGES
    rc = 0
    for stage in stages:
        code = run_stage(stage, reports, list(args.pytest_args))
        rc = rc or code
    return rc


if __name__ == "__main__":
    sys.exit(main())
