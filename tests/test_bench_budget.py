"""bench/test_budget.py reads the JUnit report pytest itself writes (a real pytest run of a
two-test file), and attributes the time to the right module and directory."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _budget_module():
    spec = importlib.util.spec_from_file_location("test_budget", REPO / "bench" / "test_budget.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["test_budget"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_budget_report_reads_a_real_junit_report(tmp_path: Path) -> None:
    suite = tmp_path / "tests" / "unit"
    suite.mkdir(parents=True)
    (suite / "test_sample.py").write_text(
        "import time\ndef test_slow():\n    time.sleep(0.3)\ndef test_fails():\n    assert False\n"
    )
    xml = tmp_path / "suite.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"--junitxml={xml}", "tests/unit/test_sample.py"],
        cwd=tmp_path, capture_output=True, check=False,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},  # no plugin imports
    )  # fmt: skip
    budget = _budget_module()
    wall, cases = budget.read_report(xml)
    assert {c.module for c in cases} == {"tests/unit/test_sample.py"}
    assert {c.name: c.outcome for c in cases} == {"test_slow": "passed", "test_fails": "failed"}
    slow = next(c for c in cases if c.name == "test_slow")
    assert slow.seconds >= 0.3 and wall >= slow.seconds
    text = budget.report(wall, cases, budget_min=0.001, top=5)
    assert "over by" in text and "1 failed, 1 passed" in text
    assert "tests/unit" in text and "tests/unit/test_sample.py::test_slow" in text
    assert budget.main([str(tmp_path / "missing.xml")]) == 2


def test_the_report_says_how_fast_its_machine_was(tmp_path: Path, capsys) -> None:
    """Minutes from two machines compare only with their pace beside them: the report
    times a fixed Python loop where it runs and prints it after the budget line."""
    xml = tmp_path / "suite-quiet.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest" tests="1" time="2.5" '
        'timestamp="2026-12-07T12:00:00"><testcase classname="tests.unit.test_a" '
        'name="test_one" file="tests/unit/test_a.py" time="2.5"/></testsuite></testsuites>'
    )
    budget = _budget_module()
    assert budget.main([str(xml)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("this machine's pace: "))
    assert f"ms for {budget.PACE_LOOP:,} iterations of a Python loop" in line
    assert int(line.split()[3]) > 0


def test_the_server_starts_a_session_counted_follow_the_budget(tmp_path: Path) -> None:
    """The session's counter (tests/server_starts.py) sees a process of this session whose
    command line is a runner's, once, under the test running then; the budget report
    prints the count from the file it writes beside the JUnit report."""
    import server_starts

    counter = server_starts.StartCounter(interval_s=0.1)
    counter.start()
    counter.current = "tests/unit/test_sample.py"
    # A stand-in with a runner's command line (the arguments after -c are only argv).
    argv = [sys.executable, "-c", "import time; time.sleep(1.5)", "-m", "runners", "run"]
    subprocess.run(argv, check=True, timeout=60)
    counter.stop()
    assert counter.counts == {("tests/unit/test_sample.py", "runner run"): 1}
    counter.write(tmp_path / "suite-heavy.starts.json")
    text = _budget_module().starts(tmp_path / "suite-heavy.starts.json")
    assert (
        "server starts (suite-heavy.starts.json): 0 vllm server, 0 transformers serve, "
        "1 runner run" in text
    )
    assert "tests/unit/test_sample.py: 1 runner run" in text
    assert _budget_module().starts(tmp_path / "missing.json") == ""


def test_a_child_seen_before_its_exec_is_counted_after_it(tmp_path: Path) -> None:
    """A runner's child shows the runner's command line until its exec: sampled in that
    window it is the runner's fork (not counted), then a vLLM server once it has exec'd."""
    import server_starts

    counter = server_starts.StartCounter(interval_s=0.1)
    counter.start()
    counter.current = "tests/unit/test_sample.py"
    script = tmp_path / "runner.py"
    script.write_text(
        "import os, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(1)  # sampled here with the parent's command line\n"
        "    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(1.5)',\n"
        "             '-m', 'vllm.entrypoints.openai.api_server'])\n"
        "os.waitpid(pid, 0)\n"
    )
    argv = [sys.executable, str(script), "-m", "runners", "run"]
    subprocess.run(argv, check=True, timeout=60)
    counter.stop()
    assert counter.counts == {
        ("tests/unit/test_sample.py", "runner run"): 1,
        ("tests/unit/test_sample.py", "vllm server"): 1,
    }
