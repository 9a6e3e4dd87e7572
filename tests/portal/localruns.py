"""Helpers for tests that look at the local executor's processes from outside."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil


def supervisor_pid(handle: dict[str, Any]) -> int | None:
    """The supervisor's pid as recorded in ``supervisor.json`` (None before it starts)."""
    started = Path(handle["workdir"]) / "supervisor.json"
    try:
        return int(json.loads(started.read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def runner_process_of(handle: dict[str, Any], timeout: float = 30) -> Any:
    """The runner (a psutil.Process) of a local executor's run: the supervisor's child.

    The supervisor records its pid in ``supervisor.json`` (with namespaces it is the child
    of ``unshare``, which the executor started)."""
    deadline = time.monotonic() + timeout
    while True:
        pid = supervisor_pid(handle)
        if pid is not None:
            children = psutil.Process(pid).children()
            if children:
                return children[0]
        if time.monotonic() > deadline:
            raise AssertionError("the supervisor did not start the runner")
        time.sleep(0.05)
