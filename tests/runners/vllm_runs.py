"""What the vLLM tests that start servers of their own share (``test_vllm.py``,
``test_vllm_cli.py``): the spec they start from and how they tell a process is gone.

``spec_for``'s server runs eager (``enforce_eager``): what the tests that keep it check
is the runner's processes, signals and records, not the compiled model, and
torch.compile's warm-up would add ~18 s to each start on 2 cores. A test that names its
own backends (the CLI's full run) starts the default, compiled server, as does the
session's shared server (``tests/shared_servers.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psutil

from runners.result import METRIC_KEYS
from runners.spec import parse_spec

VLLM_KEYS = set(METRIC_KEYS) - {"request_goodput"}  # goodput only with an SLO
CLIENT_KEYS = {"date", "backend", "model_id", "num_prompts", "max_concurrency", "duration"}


def spec_for(model: Path | str, **overrides: Any) -> Any:
    """A 2-point concurrency sweep (1 and 4, 16 prompts of 64 -> 16 tokens) on one eager
    vLLM backend; ``overrides`` replace top-level fields."""
    data = {
        "model": {"id": str(model), "max_model_len": 512},
        "workload": {"input_len": 64, "output_len": 16, "num_prompts": 16, "num_warmups": 1},
        "sweeps": [{"name": "concurrency", "axis": "max_concurrency", "values": [1, 4]}],
        "backends": [{"kind": "vllm", "enforce_eager": True}],
        **overrides,
    }
    return parse_spec(data)


def gone(pids: list[int]) -> bool:
    """Every one of ``pids`` has exited (a zombie counts as gone)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True
