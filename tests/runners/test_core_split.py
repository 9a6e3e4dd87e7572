"""The server and the load generator on disjoint cores (``runners.placement.split_cores``),
on hosts described as the kernel lays them out, and the calling thread pinned to a set
for what it starts (``runners.conditions.pinned``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runners import conditions, placement
from runners.conditions import CoreError, parse_cpu_list


def host(cpus: str, siblings: list[str] | None = None) -> placement.Host:
    return placement.Host.from_dict({"cpus": cpus, "siblings": siblings or []})


def ids(text: str) -> tuple[int, ...]:
    return tuple(parse_cpu_list(text))


def test_a_runner_with_few_cores_shares_them_and_says_why():
    for cpus in ("0", "0-1", "0-2"):
        split = placement.split_cores(host(cpus))
        assert split.shared and split.server == split.client == ids(cpus)
        count = len(ids(cpus))
        assert split.text.startswith(f"shared: the runner owns only {count} core")
    described = placement.split_cores(host("0-1")).describe()
    assert described["server_cores"] == described["client_cores"] == "0-1"
    assert described["core_split"].startswith("server and client on 0-1 (shared: ")


def test_on_the_cpu_the_server_gets_most_cores_and_the_client_one_or_a_few():
    split = placement.split_cores(host("0-7"))
    assert (split.server, split.client) == (ids("0-6"), ids("7"))
    assert split.summary() == (
        "server 0-6, client 7 (split: 7 physical cores to the server, 1 to the client "
        "(on the CPU the server computes))"
    )
    big = placement.split_cores(host("0-31"))
    assert (big.server, big.client) == (ids("0-28"), ids("29-31"))
    four = placement.split_cores(host("4-7"))
    assert (four.server, four.client) == (ids("4-6"), ids("7"))


def test_hyperthread_siblings_stay_on_one_side():
    # 8 logical CPUs, 4 physical cores: CPU n and n+4 are one core.
    ht = host("0-7", ["0,4", "1,5", "2,6", "3,7"])
    split = placement.split_cores(ht)
    assert (split.server, split.client) == (ids("0-2,4-6"), ids("3,7"))
    # Two physical cores (four threads) is too few to split, however many CPUs it shows.
    assert placement.split_cores(host("0-3", ["0,2", "1,3"])).shared


def test_with_a_gpu_the_server_needs_few_cores_and_the_client_gets_half():
    # One slot of a DGX-like socket: 4 physical cores with their siblings.
    slot = host("0-3,112-115", ["0,112", "1,113", "2,114", "3,115"])
    split = placement.split_cores(slot, gpus=1)
    assert (split.server, split.client) == (ids("0-1,112-113"), ids("2-3,114-115"))
    odd = placement.split_cores(host("0-4"), gpus=2)
    assert (len(odd.server), len(odd.client)) == (3, 2)


def test_an_explicit_server_list_takes_what_it_names_and_leaves_the_rest_to_the_client():
    split = placement.split_cores(host("0-1"), requested="0")
    assert (split.server, split.client) == ((0,), (1,))
    assert split.text == "split by SERVEBENCH_SERVER_CPUS"
    ht = placement.split_cores(host("0-3", ["0,2", "1,3"]), requested="0-1")
    assert ht.text.endswith("hyperthread siblings split between them: 0-3")
    shared = placement.split_cores(host("0-15"), requested="shared")
    assert shared.shared and shared.text == "shared: SERVEBENCH_SERVER_CPUS=shared"


@pytest.mark.parametrize(
    ("requested", "said"),
    [
        ("0-1", "leaves the load generator no core of the 0-1 this run owns"),
        ("5", "CPU 5 is not among the cores this run owns (0-1)"),
        ("x", "'x' is not a CPU list"),
    ],
)
def test_a_server_list_that_cannot_be_had_is_refused_naming_the_setting(requested, said):
    with pytest.raises(CoreError) as err:
        placement.split_cores(host("0-1"), requested=requested)
    assert said in str(err.value)
    if requested != "x":
        assert str(err.value).startswith(f"SERVEBENCH_SERVER_CPUS={requested}")


def test_the_runner_refuses_a_bad_server_list_before_it_starts(tmp_path: Path):
    env = {**os.environ, "SERVEBENCH_SERVER_CPUS": "0-4095"}
    out = str(tmp_path / "result.json")
    done = subprocess.run(
        [sys.executable, "-m", "runners", "run", "--preset", "seed", "--out", out],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "cannot split the cores: SERVEBENCH_SERVER_CPUS=0-4095: CPU" in done.stderr


def test_what_is_started_inside_pinned_runs_on_that_set_and_the_thread_comes_back():
    before = os.sched_getaffinity(0)
    target = [min(before)]
    with conditions.pinned(target):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        assert os.sched_getaffinity(child.pid) == set(target)
        assert conditions.process_affinity(child.pid) == str(target[0])
    finally:
        child.kill()
        child.wait()
    assert os.sched_getaffinity(0) == before
    with conditions.pinned(None):
        assert os.sched_getaffinity(0) == before
