"""A runner's child killed by the kernel's OOM killer exits with -9 like any SIGKILL; the
memory cgroup's oom_kill counter is what tells them apart, in either cgroup version's
layout (a container sees its own cgroup at /sys/fs/cgroup)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runners import procs


def v1(root: Path, kills: int, limit: int) -> Path:
    (root / "memory").mkdir(parents=True, exist_ok=True)
    (root / "memory" / "memory.oom_control").write_text(
        f"oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"
    )
    (root / "memory" / "memory.limit_in_bytes").write_text(f"{limit}\n")
    return root


def v2(root: Path, kills: int, limit: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {kills}\n")
    (root / "memory.max").write_text(f"{limit}\n")
    return root


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_a_kill_since_the_start_names_the_limit_and_the_next_step(tmp_path, layout):
    root = tmp_path / layout
    make = (
        (lambda k: v1(root, k, 160 << 20))
        if layout == "v1"
        else (lambda k: v2(root, k, str(160 << 20)))
    )
    make(2)
    before = procs.oom_kills(root)
    assert before == 2
    assert procs.oom_cause(before, root) is None  # nothing killed since
    make(3)
    cause = procs.oom_cause(before, root)
    assert cause is not None
    assert cause.startswith("out of memory: the kernel's OOM killer killed 1 process(es)")
    assert "its memory limit, 160Mi" in cause and "resources.memory" in cause


def test_no_limit_and_no_cgroup(tmp_path):
    v2(tmp_path / "unlimited", 0, "max")
    assert procs.memory_limit(tmp_path / "unlimited") is None
    v2(tmp_path / "unlimited", 1, "max")
    assert "the machine's memory" in (procs.oom_cause(0, tmp_path / "unlimited") or "")
    v1(tmp_path / "v1-unlimited", 0, 9223372036854771712)
    assert procs.memory_limit(tmp_path / "v1-unlimited") is None
    assert procs.oom_kills(tmp_path / "nothing") is None
    assert procs.oom_cause(None, tmp_path / "unlimited") is None


def test_quantities_are_written_as_a_spec_writes_them():
    assert [procs.quantity(n) for n in (2 << 30, 160 << 20, 3 << 10, 1000)] == [
        "2Gi",
        "160Mi",
        "3Ki",
        "1000",
    ]
