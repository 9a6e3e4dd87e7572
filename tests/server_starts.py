"""Count what the suite starts that costs a minute: vLLM servers, ``transformers serve``
and whole runner processes (``python -m runners run``, directly or through the local
executor and Celery), per test module.

A vLLM server start is ~60-100 s on 2 cores (importing torch and vLLM, loading, warming
up), so the number of starts is the robust measure of the suite's cost where wall time
depends on what else the machine runs. A thread samples the process table once a second
(the command lines of new processes only, so a sample costs milliseconds) and attributes
each new server to the test running at that moment; a process is counted once, and not
at all if its parent was counted as the same kind (vLLM's engine core, forked). A child
between fork and exec still shows its parent's command line, so a process is looked at
again until it is ``SETTLE_S`` old.
Only this session's processes count (other sessions may share the machine): those whose
environment carries the session's ``SERVEBENCH_TEST_SESSION`` mark, which every child
inherits however it was started (a Celery worker's runner, a daemon). Processes in the
one-node cluster's containers do not inherit it and are not counted.
A start that dies within a second can be missed: those cost nothing worth counting.

``tests/conftest.py`` wires it in; the table is printed at the end of the session and,
with ``SERVEBENCH_SERVER_STARTS=FILE``, written there as JSON.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import psutil

KINDS = ("vllm server", "transformers serve", "runner run")
MARK = "SERVEBENCH_TEST_SESSION"
SETTLE_S = 10.0


def kind_of(argv: list[str]) -> str | None:
    """Which expensive start this command line is, or None."""
    if "vllm.entrypoints.openai.api_server" in argv or argv[1:3] == ["serve", "--model"]:
        return "vllm server"
    if "serve" in argv and any(a.startswith("transformers") for a in argv[:4]):
        return "transformers serve"
    for i in range(len(argv) - 2):
        if argv[i : i + 3] == ["-m", "runners", "run"]:
            return "runner run"
    return None


class StartCounter:
    """Samples the process table in a daemon thread; ``counts`` maps (module, kind) to
    the number of starts seen while a test of that module ran."""

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.current = "(between tests)"
        self.counts: Counter[tuple[str, str]] = Counter()
        self._seen: set[int] = set(psutil.pids())  # what ran before the session
        self._kind: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="server-starts", daemon=True)
        self.mark = f"{os.getpid()}-{time.time_ns()}"
        self._outer: str | None = None

    def start(self) -> None:
        self._outer = os.environ.get(MARK)
        os.environ[MARK] = self.mark
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling (after a last sample) and give the environment its mark back."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()
        if self._outer is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = self._outer

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        now = time.time()
        for pid in psutil.pids():
            if pid in self._seen:
                continue
            try:
                proc = psutil.Process(pid)
                argv, parent, born = proc.cmdline(), proc.ppid(), proc.create_time()
            except psutil.Error:
                self._seen.add(pid)
                continue
            kind = kind_of(argv)
            if kind is not None and self._ours(proc):
                self._kind[pid] = kind
                if self._kind.get(parent) != kind:  # not a forked child of a counted one
                    self.counts[(self.current, kind)] += 1
                    self._seen.add(pid)
                    continue
            # Between fork and exec a child shows its parent's command line: look again.
            if now - born > SETTLE_S:
                self._seen.add(pid)

    def _ours(self, proc: psutil.Process) -> bool:
        try:
            return proc.environ().get(MARK) == self.mark
        except psutil.Error:
            return False

    def total(self, kind: str) -> int:
        return sum(n for (_, k), n in self.counts.items() if k == kind)

    def table(self) -> str:
        modules = sorted({m for m, _ in self.counts})
        totals = ", ".join(f"{self.total(k)} {k}" for k in KINDS)
        lines = [f"expensive starts: {totals} (sampled once a second)"]
        for module in modules:
            row = ", ".join(
                f"{self.counts[(module, k)]} {k}" for k in KINDS if self.counts[(module, k)]
            )
            lines.append(f"  {module}: {row}")
        return "\n".join(lines)

    def write(self, path: Path) -> None:
        data = {
            "totals": {k: self.total(k) for k in KINDS},
            "modules": {
                m: {k: n for (mm, k), n in self.counts.items() if mm == m}
                for m in sorted({m for m, _ in self.counts})
            },
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")


def output_path() -> Path | None:
    value = os.environ.get("SERVEBENCH_SERVER_STARTS", "").strip()
    return Path(value) if value else None
