"""The ``hardware`` fixture (tests/conftest.py): what CI declares about its GPU
(``SERVEBENCH_TEST_GPU``) must be what the machine has, or every test asking fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A cheap test that asks for ``hardware``.
PROBE = "tests/runners/test_gpu_check_script.py::test_it_needs_both_nvml_and_cuda"


def pytest_run(declared: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SERVEBENCH_TEST_GPU": declared}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", PROBE]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_a_declaration_the_machine_contradicts_fails_the_tests(hardware) -> None:
    wrong = "0" if hardware.nvidia else "1"
    done = pytest_run(wrong)
    assert done.returncode == 1, done.stdout[-3000:]
    if wrong == "1":
        assert "SERVEBENCH_TEST_GPU=1 says this machine has an NVIDIA GPU, but" in done.stdout
        assert "check the driver (nvidia-smi)" in done.stdout
    else:
        assert "SERVEBENCH_TEST_GPU=0 says this machine has no GPU, but NVML reads" in done.stdout


def test_the_true_declaration_passes(hardware) -> None:
    right = "1" if hardware.nvidia and hardware.cuda else "0"
    if hardware.nvidia and not hardware.cuda:
        right = ""  # NVML without CUDA: neither declaration is true; undeclared runs
    done = pytest_run(right)
    assert done.returncode == 0, done.stdout[-3000:]
