"""``CUDA_VISIBLE_DEVICES`` read by CUDA's documented rules (``runners.gpu_scope``), on a
described host: four GPUs, the last with MIG enabled and two instances on it.

The examples are the CUDA Programming Guide's where it gives one (``2,1``; ``0,2,-1,1``;
an abbreviated ``GPU-8932f937``), and the MIG User Guide's formats for MIG devices.

Then the two readers of a run's GPUs, telemetry (``runners.nvml``) and the environment's
GPU facts (``runners.environment``), on one recorded NVML session (``nvmlreplay``): they
must name the same GPUs for every value."""

from __future__ import annotations

from typing import Any

import pytest
from nvmlreplay import Replay, recording

from runners import environment, nvml
from runners.gpu_scope import Device, HostGPU, MigInstance, describe, scope

U0 = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"  # the guide's example UUID
U1 = "GPU-5f1c9e2a-0d4b-4c1e-9a7e-000000000001"
U2 = "GPU-5f1c9e2a-77aa-4c1e-9a7e-000000000002"  # shares "GPU-5f1c9e2a-" with U1
U3 = "GPU-c0ffee00-1111-2222-3333-444455556666"
MIG_A = MigInstance("MIG-d9a47cfb-d1f2-d08c-b40e-0812b597ae69", 1, 0)
MIG_B = MigInstance("MIG-d9a47cfb-aaaa-5a36-8b4d-9b07d024b1bb", 2, 0)
HOST = [
    HostGPU(0, U0),
    HostGPU(1, U1),
    HostGPU(2, U2),
    HostGPU(3, U3, (MIG_A, MIG_B)),
]


def seen(value: str | None) -> list[int]:
    return [d.gpu for d in scope(value, HOST).devices]


def test_unset_every_gpu_is_visible_in_order():
    assert seen(None) == [0, 1, 2, 3]
    assert scope(None, HOST).note == "" and describe(scope(None, HOST), 4) == ""


@pytest.mark.parametrize("value", ["", "-1"])
def test_empty_or_minus_one_hides_every_gpu(value):
    assert seen(value) == []


def test_minus_one_says_why_nothing_is_visible():
    s = scope("-1", HOST)
    assert s.note == "the list ends at '-1' (not an index)"
    assert describe(s, 4) == (
        "CUDA_VISIBLE_DEVICES='-1': no GPU is visible (the host has 4 GPUs); "
        "the list ends at '-1' (not an index)"
    )
    assert (
        describe(scope("", HOST), 4)
        == "CUDA_VISIBLE_DEVICES='': no GPU is visible (the host has 4 GPUs)"
    )


def test_indices_are_enumerated_in_the_lists_order():
    assert seen("2,1") == [2, 1]  # the guide's example: GPU 0 invisible, 2 before 1
    assert seen("3") == [3]


def test_an_invalid_index_ends_the_list():
    assert seen("0,2,-1,1") == [0, 2]  # the guide's example
    s = scope("0,7,1", HOST)  # 7: no such GPU here
    assert [d.gpu for d in s.devices] == [0]
    assert s.note == "the list ends at '7' (this host has no GPU 7), what follows it is ignored"
    assert seen("1,,0") == [1]  # an empty entry is no index
    assert seen("1,x,0") == [1]


def test_indices_are_read_as_strtoul_reads_them():
    assert seen(" 1, +2") == [1, 2]
    assert seen("1gpu2,0ampere") == [1, 0]


def test_a_full_uuid_or_a_unique_prefix_names_a_gpu():
    assert seen(f"{U3},{U0}") == [3, 0]
    assert seen("GPU-8932f937") == [0]  # the guide's abbreviated form
    assert seen("GPU-5f1c9e2a-77") == [2]


def test_an_ambiguous_or_unknown_prefix_ends_the_list():
    s = scope("GPU-8932f937,GPU-5f1c9e2a,GPU-c0ffee00", HOST)  # U1 and U2 share the middle one
    assert [d.gpu for d in s.devices] == [0]
    assert "more than one GPU's UUID starts so" in s.note
    assert seen("GPU-c0ffee00,GPU-deadbeef,GPU-8932f937") == [3]
    assert seen("GPU-5f1c9e2a") == []


def test_an_entry_of_another_kind_ends_the_list():
    assert seen(f"{U1},0") == [1]
    assert seen(f"0,{U1}") == [0]
    assert seen(f"{U1},{MIG_A.uuid}") == [1]


def test_a_mig_uuid_names_an_instance_on_its_gpu():
    s = scope(MIG_A.uuid, HOST)
    assert s.devices == (Device(3, MIG_A),) and s.gpus == [3]
    assert scope("MIG-d9a47cfb-aaaa", HOST).devices == (Device(3, MIG_B),)  # a unique prefix


def test_the_older_mig_format_names_gpu_instance_and_compute_instance():
    assert scope(f"MIG-{U3}/2/0", HOST).devices == (Device(3, MIG_B),)
    assert scope(f"MIG-{U3}/9/0", HOST).devices == ()


def test_a_process_enumerates_one_mig_device_the_first_listed():
    s = scope(f"{MIG_B.uuid},{MIG_A.uuid}", HOST)
    assert s.devices == (Device(3, MIG_B),)
    assert "one MIG device" in s.note


def test_an_unknown_or_ambiguous_mig_uuid_ends_the_list():
    assert scope("MIG-00000000-0000-0000-0000-000000000000", HOST).devices == ()
    assert scope("MIG-d9a47cfb", HOST).devices == ()  # both instances start so
    assert scope(f"{MIG_A.uuid},MIG-ffff", HOST).devices == (Device(3, MIG_A),)


def test_a_device_listed_twice_makes_the_list_invalid():
    assert seen("0,1,0") == []
    assert seen(f"{U0},GPU-8932f937") == []  # the same GPU by its UUID and a prefix
    assert seen(f"{MIG_A.uuid},{MIG_A.uuid}") == []
    assert "listed twice" in scope("1,1", HOST).note


def test_a_duplicate_after_the_end_of_the_list_is_never_read():
    assert seen("0,-1,0") == [0]
    assert seen("0,7,0") == [0]


# --------------------------------------------------------------------------- one scope for both


def two_h200s_one_with_mig() -> dict[str, Any]:
    """The recorded two-H200 session, GPU 1 in MIG mode with two 1g.18gb instances."""
    data = recording()
    data["cuda_driver_version"] = 12080
    data["devices"][1]["mig"] = [
        {
            "uuid": f"MIG-0b6e2c1d-000{i}-5a36-8b4d-9b07d024b1bb",
            "gpu_instance_id": 9 + i,
            "compute_instance_id": 0,
            "name": "NVIDIA H200 MIG 1g.18gb",
            "memory_total_bytes": 18 * 2**30,
        }
        for i in (1, 2)
    ]
    return data


@pytest.mark.parametrize(
    "value",
    [
        None,
        "0",
        "1,0",
        "1,7,0",
        "GPU-5f1c9e2a-0d4b-4c1e-9a7e-000000000001",
        "MIG-0b6e2c1d-0002",
        "MIG-GPU-5f1c9e2a-0d4b-4c1e-9a7e-000000000001/10/0",
    ],
)
def test_environment_and_telemetry_see_the_same_gpus(value, monkeypatch):
    data = two_h200s_one_with_mig()
    if value is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    facts = environment.gpu_facts(Replay(data))
    gpus = nvml.GPUs.open(Replay(data), value)
    read = [d.uuid for d in gpus.devices]
    recorded = [d.get("gpu_uuid", d["uuid"]) for d in facts["devices"]]
    assert recorded == read and facts["count"] == len(read)
    gpus.close()


def test_a_mig_device_is_recorded_as_itself_and_read_through_its_gpu(monkeypatch):
    data = two_h200s_one_with_mig()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-0b6e2c1d-0002")
    facts = environment.gpu_facts(Replay(data))
    assert (facts["model"], facts["count"], facts["memory_total_mib"]) == (
        "NVIDIA H200 MIG 1g.18gb",
        1,
        18 * 1024,
    )
    (device,) = facts["devices"]
    assert device["uuid"] == "MIG-0b6e2c1d-0002-5a36-8b4d-9b07d024b1bb"
    assert device["gpu_uuid"] == data["devices"][1]["uuid"]
    assert "scope" in facts and facts["scope"].startswith(
        "CUDA_VISIBLE_DEVICES='MIG-0b6e2c1d-0002'"
    )


@pytest.mark.parametrize("value", ["-1", "", "0,0"])
def test_a_run_that_sees_no_gpu_records_none_and_reads_none(value, monkeypatch):
    data = two_h200s_one_with_mig()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    facts = environment.gpu_facts(Replay(data))
    assert (facts["model"], facts["count"]) == ("none", 0)
    assert facts["scope"].startswith(f"CUDA_VISIBLE_DEVICES={value!r}: no GPU is visible")
    with pytest.raises(nvml.NVMLUnavailable, match="no GPU is visible"):
        nvml.GPUs.open(Replay(data), value)
