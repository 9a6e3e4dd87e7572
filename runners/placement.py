"""Which GPUs and cores each concurrent run gets on one host: the local executor's slots.

A benchmark owns its hardware. With ``SERVEBENCH_LOCAL_SLOTS=N`` the local executor runs
up to N runners at once, and each slot owns a disjoint set of GPUs and the cores nearest
them, so two runs never share a GPU (nor a physical core), and each run's numbers are
what its own hardware gave.

The host is described by ``Host``: its GPUs as NVML lists them (``runners.gpu_scope``
``HostGPU``), each GPU's CPU affinity (NVML ``nvmlDeviceGetCpuAffinity``: the cores of the
NUMA node its PCIe root sits on, what ``nvidia-smi topo -m`` prints as "CPU Affinity"),
the cores the worker may use (its ``sched_getaffinity``) and which logical CPUs are
hyperthreads of one physical core (``/sys/devices/system/cpu/cpuN/topology``).
``this_host()`` reads it; tests describe one (``Host.from_dict``).

``plan(host, slots, visible)`` decides, in this order:

1. **The devices to share out**: what the worker's own ``CUDA_VISIBLE_DEVICES``
   (``visible``) leaves visible, by CUDA's rules (``runners.gpu_scope.scope``): whole
   GPUs, or MIG instances where the worker lists ``MIG-`` UUIDs.
2. **GPUs per slot**: ``devices // slots``, the same for every slot so runs on one host
   compare; what is left over is unused and said so. More slots than devices is refused
   (``PlacementError``): two runs would share a GPU. A host with no GPU shares cores only.
3. **Which GPUs**: devices ordered by their nearest cores (NUMA node), then index, and
   dealt out in consecutive groups, so a slot's GPUs sit on one socket where they can.
4. **Cores**: the worker's cores grouped into physical cores (hyperthread siblings stay
   together: two slots on the two threads of one core would slow each other down);
   every slot gets the same number of physical cores, first from its GPUs' affinity, then
   (noted) from what is left. Fewer physical cores than slots: the slots share every
   core, and the note says so.

Each ``Slot`` says what its runner's environment gets: ``CUDA_VISIBLE_DEVICES`` (UUIDs,
which mean the same GPU to every tool whatever ``CUDA_DEVICE_ORDER`` is; indices only
where the host's UUIDs are unknown, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``) and
``SERVEBENCH_CPUS`` (the cores the runner owns and pins itself and its children to:
``runners.conditions``). The run's environment capture, telemetry, energy and capacity
all read the GPUs through that same ``CUDA_VISIBLE_DEVICES`` (``runners.gpu_scope``), so
what a run records is what its slot owns.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners import gpu_scope
from runners.conditions import format_cpu_list, parse_cpu_list


class PlacementError(ValueError):
    """The slots cannot be given disjoint hardware; the message says what to change."""


@dataclass(frozen=True)
class Host:
    """A host as placement sees it: GPUs, each GPU's nearest cores (by NVML index; a GPU
    not listed is near every core), the cores the worker may use, physical cores."""

    gpus: tuple[gpu_scope.HostGPU, ...] = ()
    gpu_cpus: Mapping[int, frozenset[int]] = field(default_factory=dict)
    cpus: frozenset[int] = frozenset()
    siblings: tuple[frozenset[int], ...] = ()  # logical CPUs of one physical core

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Host:
        """From a description: ``{"cpus": "0-223", "siblings": ["0,112", ...] (optional),
        "gpus": [{"index", "uuid", "cpu_affinity": "0-55,112-167", "mig": [...]}]}``
        (the devices of an NVML recording, ``tests/runners/nvmlreplay.py``, fit)."""
        gpus, near = [], {}
        for d in data.get("gpus") or data.get("devices") or []:
            mig = tuple(gpu_scope.MigInstance(**m) for m in d.get("mig") or [])
            gpus.append(gpu_scope.HostGPU(int(d["index"]), str(d.get("uuid", "")), mig))
            if d.get("cpu_affinity"):
                near[int(d["index"])] = frozenset(parse_cpu_list(str(d["cpu_affinity"])))
        cpus = frozenset(parse_cpu_list(str(data["cpus"])))
        siblings = tuple(frozenset(parse_cpu_list(str(s))) for s in data.get("siblings") or [])
        return cls(tuple(gpus), near, cpus, siblings)


@dataclass(frozen=True)
class Slot:
    """What one slot owns: ``devices`` (``gpu_scope.Device``), ``cpus``, and the runner's
    environment that gives them (``env``)."""

    index: int
    devices: tuple[gpu_scope.Device, ...]
    cpus: tuple[int, ...]
    env: Mapping[str, str]

    @property
    def gpus(self) -> list[int]:
        """The physical GPUs (NVML indices) the slot's devices run on."""
        return list(dict.fromkeys(d.gpu for d in self.devices))

    def describe(self) -> str:
        gpus = self.env.get("CUDA_VISIBLE_DEVICES")
        where = f"GPUs {gpus}" if gpus else "no GPU"
        return f"slot {self.index}: {where}, cores {format_cpu_list(self.cpus) or 'any'}"


@dataclass(frozen=True)
class Plan:
    """Every slot, and sentences for a person about what was left unused or shared."""

    slots: tuple[Slot, ...]
    notes: tuple[str, ...] = ()

    @property
    def gpus_per_slot(self) -> int:
        return len(self.slots[0].devices) if self.slots else 0


def _device_value(device: gpu_scope.Device, host: Host) -> str:
    """How ``CUDA_VISIBLE_DEVICES`` names ``device``: its UUID, else its index."""
    if device.mig is not None:
        return device.mig.uuid
    uuid = next((g.uuid for g in host.gpus if g.index == device.gpu), "")
    return uuid or str(device.gpu)


def _near(host: Host, gpu: int) -> frozenset[int]:
    return host.gpu_cpus.get(gpu, host.cpus) & host.cpus


def _physical_cores(host: Host) -> list[frozenset[int]]:
    """The worker's cores as physical cores (sibling groups), by lowest CPU number."""
    seen: set[int] = set()
    groups = []
    for group in host.siblings:
        allowed = group & host.cpus - seen
        if allowed:
            groups.append(frozenset(allowed))
            seen |= allowed
    groups += [frozenset({c}) for c in host.cpus - seen]
    return sorted(groups, key=min)


def plan(host: Host, slots: int, visible: str | None = None) -> Plan:
    """Disjoint GPUs and cores for ``slots`` concurrent runs (rules in the module doc);
    ``visible``: the worker's own ``CUDA_VISIBLE_DEVICES`` (None: unset)."""
    if slots < 1:
        raise PlacementError(f"SERVEBENCH_LOCAL_SLOTS={slots}: at least 1")
    notes: list[str] = []
    found = gpu_scope.scope(visible, host.gpus)
    if found.note:
        notes.append(gpu_scope.describe(found, len(host.gpus)))
    devices = sorted(found.devices, key=lambda d: (min(_near(host, d.gpu), default=0), d.gpu))
    if devices and slots > len(devices):
        raise PlacementError(
            f"SERVEBENCH_LOCAL_SLOTS={slots}, but this worker sees {len(devices)} GPU"
            f"{'s' * (len(devices) != 1)}: two runs would share a GPU. Set "
            f"SERVEBENCH_LOCAL_SLOTS to at most {len(devices)}, or give the worker more GPUs"
        )
    per = len(devices) // slots
    if devices and len(devices) % slots:
        left = devices[per * slots :]
        notes.append(
            f"{len(left)} GPU{'s' * (len(left) != 1)} unused ({per} per slot, {slots} slots): "
            + ", ".join(_device_value(d, host) for d in left)
        )
    shares = [tuple(devices[i * per : (i + 1) * per]) for i in range(slots)]

    cores = _physical_cores(host)
    per_cores = len(cores) // slots
    taken: set[frozenset[int]] = set()
    owned: list[tuple[int, ...]] = []
    for i, share in enumerate(shares):
        if per_cores == 0:
            owned.append(tuple(sorted(host.cpus)))
            continue
        near = frozenset().union(*(_near(host, d.gpu) for d in share)) if share else host.cpus
        free = [c for c in cores if c not in taken]
        mine = [c for c in free if c <= near][:per_cores]
        if len(mine) < per_cores:
            if share:
                notes.append(
                    f"slot {i}: {per_cores - len(mine)} of its {per_cores} cores are not "
                    "near its GPUs (the cores nearest them went to other slots)"
                )
            mine += [c for c in free if c not in mine][: per_cores - len(mine)]
        taken.update(mine)
        owned.append(tuple(sorted(frozenset().union(*mine))))
    if per_cores == 0 and slots > 1:
        notes.append(
            f"{len(cores)} physical cores for {slots} slots: the slots share every core, "
            "so CPU-side numbers of concurrent runs disturb each other"
        )
    out = []
    for i, (share, cpus) in enumerate(zip(shares, owned, strict=True)):
        env: dict[str, str] = {}
        if slots > 1 and (host.gpus or visible is not None):
            values = [_device_value(d, host) for d in share]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(values)
            if any(v.isdigit() for v in values):
                env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        if slots > 1 and per_cores > 0:
            env["SERVEBENCH_CPUS"] = format_cpu_list(cpus)
        out.append(Slot(i, share, cpus, env))
    return Plan(tuple(out), tuple(notes))


# --------------------------------------------------------------------------- this host


def _sibling_groups(cpus: Sequence[int], root: Path) -> tuple[frozenset[int], ...]:
    groups = []
    for cpu in cpus:
        base = root / f"cpu{cpu}" / "topology"
        for name in ("core_cpus_list", "thread_siblings_list"):
            try:
                groups.append(frozenset(parse_cpu_list((base / name).read_text().strip())))
                break
            except (OSError, ValueError):
                continue
    return tuple(dict.fromkeys(groups))


def this_host(lib: Any = None, cpu_root: Path = Path("/sys/devices/system/cpu")) -> Host:
    """This machine: NVML's GPUs and their CPU affinity (``lib``, default pynvml; none
    where NVML cannot be read), the worker's CPU affinity, physical cores from sysfs."""
    from runners import nvml

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    topology = nvml.read_topology(lib)
    gpus, near = topology if topology is not None else ([], {})
    return Host(tuple(gpus), near, frozenset(cpus), _sibling_groups(cpus, cpu_root))
