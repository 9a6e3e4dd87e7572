"""The suite's scheduling of what it shares (``tests/conftest.py``): a shared fixture stops
as soon as its last user ends, not at the session's end, and a test marked
``stops_shared_vllm`` runs after every other user. A real pytest run of two small modules
whose ``shared_vllm`` is a stand-in that logs its start and stop (a real server would cost
a minute and prove nothing more about the order)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import importlib.util, sys
from pathlib import Path
import pytest

sys.path.insert(0, {str(TESTS)!r})
spec = importlib.util.spec_from_file_location("suite_conftest", {str(TESTS / "conftest.py")!r})
suite = sys.modules["suite_conftest"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_collection_modifyitems = suite.pytest_collection_modifyitems
pytest_collection_finish = suite.pytest_collection_finish
pytest_runtest_teardown = suite.pytest_runtest_teardown
LOG = Path(__file__).parent / "log.txt"


def log(line):
    with LOG.open("a") as f:
        f.write(line + "\\n")


@pytest.fixture(scope="session")
def shared_vllm():
    log("start")
    stop = suite.stop_after_last_use("shared_vllm", lambda: log("stop"))
    yield
    stop()
    log("session end")
"""

MODULE_A = """
import pytest
from conftest import log

def test_uses(shared_vllm):
    log("a uses")

@pytest.mark.stops_shared_vllm
def test_stops(shared_vllm):
    log("a stops")

def test_after():
    log("a after")
"""

MODULE_B = """
from conftest import log

def test_uses_later(shared_vllm):
    log("b uses")

def test_none():
    log("b none")
"""


def test_the_shared_server_stops_after_its_last_user_and_stoppers_run_last(tmp_path: Path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a.py").write_text(MODULE_A)
    (tmp_path / "test_b.py").write_text(MODULE_B)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    stops_shared_vllm: x\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "log.txt").read_text().splitlines() == [
        "start",
        "a uses",
        "a after",
        "b uses",
        "a stops",  # moved after the last other user
        "stop",  # right after it, not at the session's end
        "b none",
        "session end",
    ]
