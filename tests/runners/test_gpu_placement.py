"""Each concurrent run's GPUs and cores (``runners.placement``) on a host described as a
DGX H100 is laid out: eight GPUs, two sockets of 56 cores with two threads each, GPUs 0-3
near socket 0 and 4-7 near socket 1. The GPUs and their CPU affinity are read through
NVML's own calls from the description (``nvmlreplay``), as the executor reads a real host."""

from __future__ import annotations

from pathlib import Path

import pytest
from nvmlreplay import Replay, recording

from runners import nvml, placement
from runners.conditions import parse_cpu_list

DGX = "nvml-8xh100-topology.json"


def dgx() -> placement.Host:
    """The described host: NVML's answers, plus the worker's cores and hyperthreads."""
    data = recording(DGX)
    gpus, near = nvml.read_topology(Replay(data))
    described = placement.Host.from_dict(data)
    return placement.Host(tuple(gpus), near, described.cpus, described.siblings)


def uuid(i: int) -> str:
    return recording(DGX)["devices"][i]["uuid"]


def cpus(text: str) -> tuple[int, ...]:
    return tuple(parse_cpu_list(text))


def assert_disjoint(p: placement.Plan) -> None:
    for a in p.slots:
        for b in p.slots:
            if a.index < b.index:
                assert not set(a.gpus) & set(b.gpus)
                assert not set(a.cpus) & set(b.cpus)


def test_nvml_says_which_cores_are_nearest_each_gpu():
    gpus, near = nvml.read_topology(Replay(recording(DGX)))
    assert [g.index for g in gpus] == list(range(8))
    assert near[0] == near[3] == frozenset(cpus("0-55,112-167"))
    assert near[4] == near[7] == frozenset(cpus("56-111,168-223"))
    # The described host is the same whether read through NVML or from its description.
    assert placement.Host.from_dict(recording(DGX)).gpu_cpus == near


def test_four_slots_get_two_gpus_each_and_the_physical_cores_of_their_socket():
    p = placement.plan(dgx(), 4)
    assert [s.gpus for s in p.slots] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [s.cpus for s in p.slots] == [
        cpus("0-27,112-139"),
        cpus("28-55,140-167"),
        cpus("56-83,168-195"),
        cpus("84-111,196-223"),
    ]
    assert_disjoint(p)
    assert p.slots[1].env == {
        "CUDA_VISIBLE_DEVICES": f"{uuid(2)},{uuid(3)}",
        "SERVEBENCH_CPUS": "28-55,140-167",
    }
    assert p.gpus_per_slot == 2 and p.notes == ()
    assert p.slots[2].describe() == (f"slot 2: GPUs {uuid(4)},{uuid(5)}, cores 56-83,168-195")


def test_two_slots_split_the_host_by_socket():
    p = placement.plan(dgx(), 2)
    assert [s.gpus for s in p.slots] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [s.cpus for s in p.slots] == [cpus("0-55,112-167"), cpus("56-111,168-223")]


def test_gpus_that_do_not_divide_evenly_are_left_unused_and_said_so():
    p = placement.plan(dgx(), 3)
    assert [s.gpus for s in p.slots] == [[0, 1], [2, 3], [4, 5]]
    assert_disjoint(p)
    assert all(len(s.cpus) == 2 * 37 for s in p.slots)  # 112 physical cores // 3
    assert f"2 GPUs unused (2 per slot, 3 slots): {uuid(6)}, {uuid(7)}" in p.notes
    # Socket 0 has 56 cores for two slots of 37: the second gets 18 from socket 1.
    assert "slot 1: 18 of its 37 cores are not near its GPUs" in p.notes[1]


def test_the_workers_own_cuda_visible_devices_is_what_the_slots_share():
    p = placement.plan(dgx(), 2, visible="4,5,6,7")
    assert [s.gpus for s in p.slots] == [[4, 5], [6, 7]]
    # Every core of the worker is shared out: the second slot's half is the other socket.
    assert [s.cpus for s in p.slots] == [cpus("56-111,168-223"), cpus("0-55,112-167")]
    assert p.notes == (
        "slot 1: 56 of its 56 cores are not near its GPUs (the cores "
        "nearest them went to other slots)",
    )
    assert p.slots[0].env["CUDA_VISIBLE_DEVICES"] == f"{uuid(4)},{uuid(5)}"
    # The list ends at an invalid entry (CUDA's rule), and the note says so.
    p = placement.plan(dgx(), 2, visible="0,1,9,2")
    assert [s.gpus for s in p.slots] == [[0], [1]]
    assert "the list ends at '9'" in p.notes[0]


def test_more_slots_than_gpus_is_refused_naming_the_setting():
    with pytest.raises(placement.PlacementError) as caught:
        placement.plan(dgx(), 9)
    assert str(caught.value) == (
        "SERVEBENCH_LOCAL_SLOTS=9, but this worker sees 8 GPUs: two runs would share a "
        "GPU. Set SERVEBENCH_LOCAL_SLOTS to at most 8, or give the worker more GPUs"
    )
    # The worker's GPUs hidden on purpose: the runs are CPU runs, and stay so.
    cpu_only = placement.plan(dgx(), 2, visible="")
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in cpu_only.slots] == ["", ""]
    assert_disjoint(cpu_only)


def test_one_slot_owns_the_machine_and_changes_nothing():
    p = placement.plan(dgx(), 1)
    assert p.slots[0].gpus == list(range(8)) and len(p.slots[0].cpus) == 224
    assert p.slots[0].env == {}  # the runner inherits the worker's GPUs and cores


def test_gpus_known_by_index_only_are_named_in_pci_order():
    host = placement.Host(
        gpus=tuple(placement.gpu_scope.HostGPU(i, "") for i in range(2)),
        cpus=frozenset(range(4)),
    )
    p = placement.plan(host, 2)
    assert p.slots[1].env == {
        "CUDA_VISIBLE_DEVICES": "1",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "SERVEBENCH_CPUS": "2-3",
    }


def test_a_host_without_gpus_divides_its_cores():
    pairs = (frozenset({0, 2}), frozenset({1, 3}))
    host = placement.Host(cpus=frozenset({0, 1, 2, 3}), siblings=pairs)
    p = placement.plan(host, 2)
    assert [s.cpus for s in p.slots] == [(0, 2), (1, 3)]  # hyperthreads stay together
    assert [s.env for s in p.slots] == [{"SERVEBENCH_CPUS": "0,2"}, {"SERVEBENCH_CPUS": "1,3"}]
    shared = placement.plan(placement.Host(cpus=frozenset({0})), 2)
    assert [s.cpus for s in shared.slots] == [(0,), (0,)]
    assert "the slots share every core" in shared.notes[0]
    assert [s.env for s in shared.slots] == [{}, {}]


def test_this_host_reads_nvml_and_the_kernels_core_topology(tmp_path: Path):
    import os

    mine = sorted(os.sched_getaffinity(0))
    for cpu in mine:
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "core_cpus_list").write_text(f"{cpu}\n")
    host = placement.this_host(Replay(recording(DGX)), cpu_root=tmp_path)
    assert len(host.gpus) == 8 and host.cpus == frozenset(mine)
    assert host.siblings == tuple(frozenset({c}) for c in mine)
