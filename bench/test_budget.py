"""The test phase against its budget: where the suite's minutes go.

``make test`` runs the suite as a few pytest sessions (``scripts/suite.py``), each writing
a JUnit report (``artifacts/test-reports/suite-<group>.xml``); this reads them and prints
the phase's wall time against the budget (30 minutes on a quiet 2-core machine), each
session's, the time per directory and per module, and the slowest tests, so a change that
makes the suite slower shows where. The phase's wall time is the span from the first
session's start to the last one's end (sessions that ran at the same time overlap; their
tests' own times then include what the other session cost them). It reports; it never
fails a build (speed is judged by people reading ratios, not by timed assertions).

    python bench/test_budget.py [REPORT.xml ...] [--budget-min 30] [--top 25]

It also times a fixed pure-Python loop on the machine it runs on (``pace``): the suite's
minutes scale with the machine (the same tree's groups took 1.6-1.8x longer on one 2-core
machine than on another), so a report says how fast its machine was.

Where a session also wrote how many vLLM servers, ``transformers serve`` and runner
processes each module started (``<report>.starts.json`` beside its report:
``tests/server_starts.py``), those counts follow: the robust measure of what the suite
costs, where its minutes depend on what else the machine ran.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPORTS = Path("artifacts/test-reports")


@dataclass(frozen=True)
class Case:
    module: str  # tests/portal/test_api.py
    name: str
    seconds: float
    outcome: str  # passed, failed, error, skipped


@dataclass(frozen=True)
class Session:
    name: str  # the report's stem: suite-quiet
    start: float  # epoch seconds
    seconds: float  # its wall time as pytest reported it
    tests: int


def read_session(path: Path) -> tuple[Session, list[Case]]:
    """The session a report describes (when it started, its wall time) and its cases."""
    root = ET.parse(path).getroot()  # noqa: S314 (a report our own make test wrote)
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    wall = sum(float(s.get("time") or 0) for s in suites)
    stamps = [s.get("timestamp") for s in suites if s.get("timestamp")]
    # pytest writes the session's start in local time, without a zone: read it back so.
    start = min(dt.datetime.fromisoformat(t).timestamp() for t in stamps) if stamps else 0.0
    cases = _cases(root)
    return Session(path.stem, start, wall, len(cases)), cases


def span(sessions: list[Session]) -> float:
    """The wall time of sessions run one after another or at once: first start to last end
    (their sum where a report has no start)."""
    if any(s.start == 0.0 for s in sessions):
        return sum(s.seconds for s in sessions)
    return max(s.start + s.seconds for s in sessions) - min(s.start for s in sessions)


def read_report(path: Path) -> tuple[float, list[Case]]:
    """(the session's wall time as pytest reported it, its test cases)."""
    session, cases = read_session(path)
    return session.seconds, cases


def _cases(root: ET.Element) -> list[Case]:
    cases = []
    for case in root.iter("testcase"):
        classname = case.get("classname") or ""
        # pytest writes "tests.portal.test_api" (plus ".Class" for methods).
        parts = classname.split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        module = "/".join(parts) + ".py" if parts else classname
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
        cases.append(Case(module, case.get("name") or "", float(case.get("time") or 0), outcome))
    return cases


PACE_LOOP = 1_000_000
PACE_ROUNDS = 5


def pace() -> float:
    """Seconds this machine takes for ``PACE_LOOP`` iterations of a pure-Python loop, the
    best of ``PACE_ROUNDS`` (other processes only ever slow one down): one core's pace at
    what the suite mostly runs, the interpreter."""
    best = float("inf")
    for _ in range(PACE_ROUNDS):
        t0 = time.perf_counter()
        total = 0
        for i in range(PACE_LOOP):
            total += i * i
        best = min(best, time.perf_counter() - t0)
    return best


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:5.1f} min"


def report(
    wall: float,
    cases: list[Case],
    budget_min: float,
    top: int,
    sessions: list[Session] | None = None,
    pace_s: float | None = None,
) -> str:
    total = sum(c.seconds for c in cases)
    budget = budget_min * 60
    lines = [
        f"test phase: {_minutes(wall)} for {len(cases)} tests; budget {budget_min:g} min "
        f"on a quiet 2-core machine: {wall / budget:.2f}x the budget "
        + ("(within)" if wall <= budget else f"(over by {_minutes(wall - budget).strip()})"),
    ]
    if pace_s is not None:
        lines.append(
            f"this machine's pace: {pace_s * 1000:.0f} ms for {PACE_LOOP:,} iterations of a "
            f"Python loop (best of {PACE_ROUNDS}; compare it before comparing two reports' "
            "minutes)"
        )
    if sessions and len(sessions) > 1:
        first = min(s.start for s in sessions)
        lines.append("sessions (start after the first, wall time, tests):")
        for s in sorted(sessions, key=lambda s: s.start):
            at = f"+{_minutes(s.start - first).strip()}" if s.start else "?"
            lines.append(f"  {s.name}: {at}, {_minutes(s.seconds).strip()}, {s.tests} tests")
    outcomes: dict[str, int] = defaultdict(int)
    for c in cases:
        outcomes[c.outcome] += 1
    lines.append("outcomes: " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())))
    by_dir: dict[str, float] = defaultdict(float)
    by_module: dict[str, float] = defaultdict(float)
    for c in cases:
        by_dir[str(Path(c.module).parent)] += c.seconds
        by_module[c.module] += c.seconds
    lines.append("")
    lines.append("by directory (share of the tests' own time):")
    for name, seconds in sorted(by_dir.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {_minutes(seconds)}  {seconds / max(total, 1e-9):5.1%}  {name}")
    lines.append("")
    lines.append(f"the {top} slowest modules:")
    for name, seconds in sorted(by_module.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"  {_minutes(seconds)}  {name}")
    lines.append("")
    lines.append(f"the {top} slowest tests (setup and teardown included):")
    for c in sorted(cases, key=lambda c: -c.seconds)[:top]:
        lines.append(f"  {c.seconds:7.1f} s  {c.module}::{c.name}")
    return "\n".join(lines)


def starts(path: Path) -> str:
    """The server starts a session counted (``<report>.starts.json``), most first; "" when
    the session wrote none."""
    if not path.is_file():
        return ""
    data = json.loads(path.read_text())
    totals = ", ".join(f"{n} {k}" for k, n in data["totals"].items()) or "none"
    lines = ["", f"server starts ({path.name}): {totals}"]
    modules = sorted(data["modules"].items(), key=lambda kv: -sum(kv[1].values()))
    for module, counts in modules:
        lines.append(f"  {module}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="*", type=Path)
    parser.add_argument("--budget-min", type=float, default=30.0)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    paths = args.reports or sorted(REPORTS.glob("suite*.xml"))
    if not paths:
        print(
            f"test_budget: no report under {REPORTS}: run `make test` (it writes them) or give "
            "the paths of pytest --junitxml reports",
            file=sys.stderr,
        )
        return 2
    sessions, cases = [], []
    for path in paths:
        if not path.is_file():
            print(
                f"test_budget: no report at {path}: run `make test` (it writes them) or give "
                "the path of a pytest --junitxml report",
                file=sys.stderr,
            )
            return 2
        session, found = read_session(path)
        sessions.append(session)
        cases += found
    print(report(span(sessions), cases, args.budget_min, args.top, sessions, pace()))
    for path in paths:
        if text := starts(path.with_suffix(".starts.json")):
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
