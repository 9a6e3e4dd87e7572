"""scripts/suite.py: make test's suite as grouped pytest sessions.

The groups partition the suite (every test runs once, in one session), a stage's groups
really run at the same time, each writes its own report and server-start file, a failing
background session fails the phase and its output is printed, and bench/test_budget.py
reads the reports back as one phase whose wall time is their span, not their sum.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


suite = _load("suite_script", REPO / "scripts" / "suite.py")
budget = _load("test_budget", REPO / "bench" / "test_budget.py")


def _collected(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _ids(proc: subprocess.Popen[str]) -> list[str]:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return [line for line in out.splitlines() if "::" in line]


def test_the_groups_partition_the_suite() -> None:
    """Each test of `pytest` (the fuzz tests too) is in exactly one group's session."""
    groups = [group for stage in suite.STAGES for lane in stage for group in lane]
    procs = {g.name: _collected(g.args) for g in groups}
    everything, one_session = _collected([]), _collected(suite.ONE_SESSION.args)
    whole = _ids(everything)
    by_group = {name: _ids(proc) for name, proc in procs.items()}
    seen: list[str] = [test for ids in by_group.values() for test in ids]
    assert len(seen) == len(set(seen)), "a test is in two groups"
    assert sorted(seen) == sorted(whole)
    assert all(test.startswith("tests/k8s_e2e/") for test in by_group["cluster"])
    assert all(test.startswith(suite.FUZZ) for test in by_group["fuzz"])
    # --one-session (make test PYTEST_ARGS=...) is everything but fuzz, which follows it.
    assert sorted(_ids(one_session)) == sorted(t for t in whole if t not in by_group["fuzz"])
    assert all(by_group.values()), {name: len(ids) for name, ids in by_group.items()}
    # The tests that judge what they measure run alone (heavy); none of them runs beside
    # the cluster (quiet, shared).
    for judged in ("test_vllm.py", "test_cli_real_runs.py", "test_endpoints.py"):
        assert any(judged in t for t in by_group["heavy"]), judged
        assert not any(judged in t for t in by_group["quiet"] + by_group["shared"]), judged
    assert any("test_quickstart.py" in t for t in by_group["shared"])


BARRIER = """
import os, time
from pathlib import Path

def test_meets_the_other_session():
    here = Path(os.environ["BARRIER_DIR"])
    (here / "{me}").touch()
    deadline = time.monotonic() + 60
    while not (here / "{other}").exists():  # only a session running at once arrives
        assert time.monotonic() < deadline, "the other session never ran beside this one"
        time.sleep(0.05)
"""


def _toy_tree(root: Path) -> None:
    for me, other in (("a", "b"), ("b", "a")):
        (root / "tests" / me).mkdir(parents=True)
        (root / "tests" / me / f"test_{me}.py").write_text(BARRIER.format(me=me, other=other))
    (root / "tests" / "c").mkdir()
    (root / "tests" / "c" / "test_c.py").write_text("def test_fails():\n    assert 1 == 2\n")


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _toy_tree(tmp_path)
    monkeypatch.setenv("BARRIER_DIR", str(tmp_path))
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # no plugin imports
    return tmp_path


def test_a_stages_groups_run_at_once_and_the_budget_reads_their_span(
    toy: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    reports = toy / "reports"
    reports.mkdir()
    stage = [[suite.Group("fg", ["tests/a"])], [suite.Group("bg", ["tests/b"])]]
    assert suite.run_stage(stage, reports, ["-p", "no:cacheprovider"], cwd=toy) == 0
    out = capfd.readouterr().out
    assert "suite: group 'fg' took" in out and "suite: group 'bg' took" in out
    assert "output of group 'bg'" in out and "1 passed" in out
    sessions = [budget.read_session(reports / f"suite-{n}.xml")[0] for n in ("fg", "bg")]
    fg, bg = sessions
    # They overlapped (the barrier proves it), so the phase is shorter than their sum.
    assert fg.start < bg.start + bg.seconds and bg.start < fg.start + fg.seconds
    assert budget.span(sessions) < fg.seconds + bg.seconds
    text = budget.report(budget.span(sessions), [], budget_min=30, top=5, sessions=sessions)
    assert "sessions (start after the first, wall time, tests):" in text
    assert "suite-fg: +" in text and "suite-bg: +" in text


def test_a_failing_background_session_fails_the_phase_and_its_lane_goes_on(
    toy: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    reports = toy / "reports"
    reports.mkdir()
    (toy / "a").touch()  # b's partner has already arrived: b passes alone
    stage = [
        [suite.Group("fg", ["tests/c"])],
        [suite.Group("bad", ["tests/c"]), suite.Group("after", ["tests/b"])],
    ]
    assert suite.run_stage(stage, reports, ["-p", "no:cacheprovider"], cwd=toy) == 1
    out = capfd.readouterr().out
    assert "'bad' then 'after' started in the background" in out
    assert out.count("assert 1 == 2") >= 2  # the foreground's, and the background log's
    assert "suite: group 'bad' took" in out and "(exit 1)" in out
    # The lane went on after its failing session, one after the other.
    assert "suite: group 'after' took" in out and "(exit 0)" in out
    bad, after = (budget.read_session(reports / f"suite-{n}.xml")[0] for n in ("bad", "after"))
    assert after.start >= bad.start + bad.seconds - 0.5
    for name in ("bad", "after"):
        assert (reports / f"suite-{name}.log").is_file()
