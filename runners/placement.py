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
from runners.conditions import CoreError, format_cpu_list, parse_cpu_list


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


# --------------------------------------------------------------------------- server vs client

SERVER_CPUS_ENV = "SERVEBENCH_SERVER_CPUS"
SPLIT_MIN_CORES = 4  # physical cores the runner must own before server and client get their own
SHARED = "shared"


@dataclass(frozen=True)
class CoreSplit:
    """The runner's cores shared out between the server it starts (``server``) and the
    load generator it runs (``client``: the runner's own process and the bench client);
    both are every owned core when they are not split (``shared``)."""

    server: tuple[int, ...]
    client: tuple[int, ...]
    text: str  # for a person: what each side got, or why they share

    @property
    def shared(self) -> bool:
        return self.server == self.client

    def summary(self) -> str:
        """One line: 'server 0-5, client 6-7 (split: ...)', or why they share."""
        if self.shared:
            return f"server and client on {format_cpu_list(self.server)} ({self.text})"
        server, client = format_cpu_list(self.server), format_cpu_list(self.client)
        return f"server {server}, client {client} ({self.text})"

    def describe(self) -> dict[str, str]:
        """What a measurement's conditions and the run's environment record."""
        return {
            "server_cores": format_cpu_list(self.server),
            "client_cores": format_cpu_list(self.client),
            "core_split": self.summary(),
        }


def owned_host(cpus: Sequence[int], cpu_root: Path = Path("/sys/devices/system/cpu")) -> Host:
    """The cores a runner owns as a ``Host`` (no GPUs): enough for ``split_cores``."""
    return Host(cpus=frozenset(cpus), siblings=_sibling_groups(sorted(cpus), cpu_root))


def split_for(
    cpus: Sequence[int], gpus: int = 0, environ: Mapping[str, str] | None = None
) -> CoreSplit:
    """``split_cores`` of the cores ``cpus`` a runner owns, as ``SERVEBENCH_SERVER_CPUS``
    (in ``environ``, default this process's environment) asks."""
    environ = os.environ if environ is None else environ
    return split_cores(owned_host(cpus), gpus, environ.get(SERVER_CPUS_ENV))


def _flat(groups: Sequence[frozenset[int]]) -> tuple[int, ...]:
    return tuple(sorted(frozenset().union(*groups)))


def split_cores(host: Host, gpus: int = 0, requested: str | None = None) -> CoreSplit:
    """Disjoint cores for the server and the load generator out of ``host.cpus`` (the
    cores the runner owns), by these rules:

    - ``requested`` (``SERVEBENCH_SERVER_CPUS``): ``shared`` keeps them together; a CPU
      list (``0-5``) is the server's, the rest of the owned cores the client's (it must
      leave the client one at least);
    - fewer than ``SPLIT_MIN_CORES`` physical cores: shared (one core each would starve
      both);
    - else whole physical cores (hyperthread siblings together), the lowest-numbered to
      the server: on a CPU-only machine the server computes, so the client gets
      ``1 + cores // 16`` of them; with ``gpus`` the server needs few cores (its API
      process, engine loop and one worker per GPU), so each side gets half, the server
      the larger half.

    CoreError (from ``runners.conditions``) names ``SERVEBENCH_SERVER_CPUS`` when the
    requested list cannot be had."""
    owned = tuple(sorted(host.cpus))
    text = (requested or "").strip()
    if text.lower() == SHARED:
        return CoreSplit(owned, owned, f"shared: {SERVER_CPUS_ENV}={SHARED}")
    if text:
        server = parse_cpu_list(text)
        outside = sorted(set(server) - host.cpus)
        if outside:
            raise CoreError(
                f"{SERVER_CPUS_ENV}={text}: CPU {format_cpu_list(outside)} is not among the "
                f"cores this run owns ({format_cpu_list(owned)}); name a subset of them, or "
                f"'{SHARED}'"
            )
        client = tuple(c for c in owned if c not in server)
        if not client:
            raise CoreError(
                f"{SERVER_CPUS_ENV}={text} leaves the load generator no core of the "
                f"{format_cpu_list(owned)} this run owns: leave it one at least, or set "
                f"'{SHARED}'"
            )
        split = [g for g in _physical_cores(host) if g & set(server) and g - set(server)]
        note = (
            f"; hyperthread siblings split between them: {format_cpu_list(_flat(split))}"
            if split
            else ""
        )
        return CoreSplit(tuple(server), client, f"split by {SERVER_CPUS_ENV}{note}")
    cores = _physical_cores(host)
    if len(cores) < SPLIT_MIN_CORES:
        count = len(cores)
        return CoreSplit(
            owned,
            owned,
            f"shared: the runner owns only {count} core{'s' * (count != 1)} (server and "
            f"client get their own from {SPLIT_MIN_CORES} physical cores)",
        )
    client_count = len(cores) // 2 if gpus > 0 else 1 + len(cores) // 16
    server_groups = cores[: len(cores) - client_count]
    why = "with a GPU, half each" if gpus > 0 else "on the CPU the server computes"
    return CoreSplit(
        _flat(server_groups),
        _flat(cores[len(server_groups) :]),
        f"split: {len(server_groups)} physical cores to the server, {client_count} to the "
        f"client ({why})",
    )
