"""Core ownership and the conditions of a measurement, on this machine's real /proc.

The contended cases are made real: a process burning a CPU on the cores being watched.
Nothing asserts on how long anything took; CPU-time assertions use work measured in CPU
time (a child that spins until its own ``process_time`` reaches a value).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from runners import conditions
from runners.conditions import CoreError, Cores, Watch

REPO = Path(__file__).resolve().parents[2]

# Spins until this process has used SECONDS of CPU time, on the CPUs given (if any).
SPIN = """
import os, sys, time
if len(sys.argv) > 2:
    os.sched_setaffinity(0, {int(c) for c in sys.argv[2].split(",")})
while time.process_time() < float(sys.argv[1]):
    pass
"""


def spin(seconds: float, cpus: str | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SPIN, str(seconds), *([cpus] if cpus else [])])


@pytest.fixture
def burner() -> Iterator[Callable[[int], int]]:
    """Start CPU-burning processes pinned to given cores, *not* descendants of this one
    (a measurement's own children count as its own work): each is started by a short-lived
    intermediate process, so it is reparented away. After the test every process carrying
    this fixture's marker in its argv is killed."""
    marker = f"servebench-test-burner-{uuid.uuid4().hex}"
    started: list[int] = []

    def start(cpu: int) -> int:
        launch = (
            "import subprocess, sys\n"
            "p = subprocess.Popen(sys.argv[1:], start_new_session=True,\n"
            "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(p.pid)\n"
        )
        burn = [sys.executable, "-c", SPIN, "3600", str(cpu), marker]
        out = subprocess.run([sys.executable, "-c", launch, *burn], capture_output=True, text=True)
        started.append(int(out.stdout))
        return started[-1]

    yield start
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)


def one_core() -> int:
    return sorted(os.sched_getaffinity(0))[-1]


def test_cpu_lists_read_and_write_the_kernels_format():
    assert conditions.parse_cpu_list("0-3,6") == [0, 1, 2, 3, 6]
    assert conditions.parse_cpu_list("5, 2-3") == [2, 3, 5]
    assert conditions.format_cpu_list([6, 0, 1, 2, 3]) == "0-3,6"
    assert conditions.format_cpu_list([1]) == "1"
    for bad in ("", "a", "3-1", "1-", "-2", ","):
        with pytest.raises(CoreError):
            conditions.parse_cpu_list(bad)


def test_by_default_it_owns_its_affinity_with_one_thread_per_core():
    cores = conditions.own_cores(environ={})
    assert list(cores.ids) == sorted(os.sched_getaffinity(0))
    assert cores.source == "affinity"
    quota = conditions.cgroup_cpu_quota()
    if quota is None or quota >= len(cores.ids):
        assert (cores.threads, cores.threads_source) == (len(cores.ids), "cores")
    else:
        assert (cores.threads, cores.threads_source) == (max(1, int(quota)), "cpu quota")


def test_a_requested_core_set_sizes_the_threads_and_names_where_it_came_from():
    cpu = one_core()
    flag = conditions.own_cores(str(cpu), environ={})
    assert (flag.ids, flag.source, flag.threads) == ((cpu,), "--cpus", 1)
    env = conditions.own_cores(environ={"SERVEBENCH_CPUS": str(cpu)})
    assert (env.ids, env.source) == ((cpu,), "SERVEBENCH_CPUS")
    inherited = conditions.own_cores(str(cpu), environ={"OMP_NUM_THREADS": "3"})
    assert inherited.threads == 1  # threads follow the cores owned, not the inherited value
    assert conditions.thread_env(flag) == {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }


def test_a_core_it_may_not_run_on_is_refused_with_the_allowed_ones():
    allowed = conditions.format_cpu_list(sorted(os.sched_getaffinity(0)))
    with pytest.raises(CoreError, match=f"not among the CPUs this process may run on \\({allowed}"):
        conditions.own_cores("4095", environ={})


def test_pinning_binds_the_process_and_its_children(tmp_path):
    cpu = one_core()
    script = (
        "import os, subprocess, sys\n"
        "from runners import conditions\n"
        f"conditions.pin(conditions.own_cores('{cpu}'))\n"
        "child = subprocess.run([sys.executable, '-c', "
        "'import os; print(sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True)\n"
        "print(sorted(os.sched_getaffinity(0)), child.stdout.strip())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == [f"[{cpu}]", f"[{cpu}]"]


def test_a_child_that_ends_inside_the_window_counts_as_the_measurements_own():
    cores = conditions.own_cores(environ={})
    with Watch(cores) as watch:
        child = spin(0.3)
        child.wait()
    c = watch.result()
    assert c["process_cpu_s"] >= 0.25  # the child's CPU time, reaped inside the window
    assert child.pid not in {p["pid"] for p in c["top_others"]}
    assert c["cores"] == conditions.format_cpu_list(sorted(os.sched_getaffinity(0)))
    for key in ("wall_s", "others_cpu_s", "others_share", "steal_share", "load_avg"):
        assert key in c
    assert isinstance(c["contended"], bool) and isinstance(c["reasons"], list)


def test_another_process_on_the_owned_core_marks_the_measurement_contended(burner):
    cpu = one_core()
    cores = Cores((cpu,), "--cpus", 1, "cores")
    burner(cpu)
    with Watch(cores) as watch:
        work = spin(0.5, str(cpu))  # our measurement, sharing the core with the rival
        work.wait()
    c = watch.result()
    assert c["contended"] is True
    assert c["others_share"] >= conditions.CONTENDED_SHARE
    assert any(r.startswith("other processes used") for r in c["reasons"])


def test_a_cpu_bound_measurement_that_was_kept_waiting_says_so(burner):
    cpu = one_core()
    script = (
        "import json, os, time\n"
        "from runners import conditions\n"
        f"cores = conditions.own_cores('{cpu}')\n"
        "conditions.pin(cores)\n"
        "with conditions.Watch(cores, cpu_bound=True) as w:\n"
        "    t0 = time.process_time()\n"
        "    while time.process_time() - t0 < 0.5:\n"
        "        pass\n"
        "print(json.dumps(w.result()))\n"
    )
    burner(cpu)
    burner(cpu)  # two rivals on one core: we get a third of it at best
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    c = json.loads(out)
    assert c["contended"] is True
    assert c["process_cpu_per_wall"] < conditions.MIN_CPU_PER_WALL
    assert any("it was kept waiting" in r for r in c["reasons"])


def measured(**fields: object) -> dict:
    base = {"wall_s": 10.0, "core_count": 2, "others_cpu_s": 0.0, "others_share": 0.0}
    base |= {"steal_share": 0.0, "throttled_s": 0.0, "process_cpu_per_wall": 1.0}
    return base | fields


def test_the_rules_judge_what_was_measured():
    judge = conditions.judge
    assert judge(measured(others_cpu_s=0.5, others_share=0.025), threads=2) == []
    (busy,) = judge(measured(others_cpu_s=4.6, others_share=0.23), threads=2)
    assert busy == "other processes used 0.46 CPUs of the 2 cores it owned (23% of their time)"
    # A CPU quota of 4 on 64 cores: the other 60 are headroom, not contention...
    quota = {"core_count": 64, "others_cpu_s": 550.0, "others_share": 0.86}
    assert judge(measured(**quota), threads=4) == []
    # ...until others eat into the 4 its threads need.
    quota |= {"others_cpu_s": 610.0, "others_share": 0.95}
    (eaten,) = judge(measured(**quota), threads=4)
    assert "leaving fewer than the 4 its CPU quota allows" in eaten
    assert judge(measured(steal_share=0.08), threads=2) == [
        "the hypervisor took 8% of its cores' time (CPU steal)"
    ]
    assert judge(measured(throttled_s=1.5), threads=2) == [
        "its cgroup's CPU quota throttled it for 1.50 s of 10.00 s"
    ]
    waited = measured(process_cpu_per_wall=0.6)
    assert judge(waited, threads=2) == []  # a server waiting on requests is not contended
    assert "it was kept waiting" in judge(waited, threads=2, cpu_bound=True)[0]
