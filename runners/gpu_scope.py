"""Which GPUs a process uses: ``CUDA_VISIBLE_DEVICES`` read by CUDA's rules, in one place.

NVML lists every GPU of the host; a CUDA process uses only those its
``CUDA_VISIBLE_DEVICES`` names. Telemetry (``runners.nvml``), the environment's GPU count
and model (``runners.environment``), the portal's preflight (how many GPUs the local
executor can give) all ask ``scope(value, host)`` and get the same answer: the devices
the process sees, in CUDA's order, each with the physical GPU it runs on. Pure Python;
the host's GPU list comes from NVML (``runners.nvml.host_gpus``) or a recording.

The rules (CUDA Programming Guide, "CUDA Environment Variables", ``CUDA_VISIBLE_DEVICES``,
https://docs.nvidia.com/cuda/cuda-programming-guide/05-appendices/environment-variables.html;
the MIG User Guide, "CUDA Device Enumeration",
https://docs.nvidia.com/datacenter/tesla/mig-user-guide/):

1. Unset: every GPU of the host is visible (counted whole here, a MIG-enabled one too:
   where MIG is used, the device plugin or the person sets ``MIG-`` values). Set to the
   empty string: none is.
2. The value is a comma-separated list; devices are enumerated in the list's order.
3. An integer index is the GPU's ordinal as nvidia-smi (and NVML) numbers them, from 0.
4. ``GPU-<uuid>`` names a GPU by its UUID (``nvidia-smi -L``); any prefix of it (with
   ``GPU-``) is enough when no other GPU of the host starts with the same characters.
5. ``MIG-<uuid>`` names a MIG instance by its UUID (drivers R470 and later; before them
   ``MIG-GPU-<gpu uuid>/<GPU instance id>/<compute instance id>``). A process enumerates
   a single MIG device: the first one listed (CUDA 11 and 12 "only enumeration of a single
   MIG instance is supported").
6. The list ends at the first invalid entry: only the devices listed before it are
   visible (``0,2,-1,1`` makes 0 and 2 visible, 1 not). Invalid: a negative or missing
   index, an index the host does not have, a UUID (or prefix) that names no GPU or more
   than one, a MIG UUID that names no instance.

Where the guide says nothing, this module reads CUDA as PyTorch does
(``torch.cuda._parse_visible_devices`` and ``_transform_uuid_to_ordinals``, which mirror
the driver for ``torch.cuda.device_count()`` without initialising CUDA):

7. A device listed twice makes the whole list invalid: no device is visible.
8. An index is read like C's ``strtoul``: leading blanks, an optional ``+``, then the
   digits (``1gpu2`` is 1); no digit at all is invalid (so is an empty entry).
9. The value's first characters say what the list holds (``GPU-`` or ``MIG-`` UUIDs, else
   indices); an entry of another kind is invalid, so it ends the list. A UUID entry is
   compared as written (no blank is skipped).

Two readings of ours: a MIG UUID, like a GPU UUID, may be shortened to a prefix no other
instance shares (the guide speaks of GPU UUIDs only); and a duplicate after the list has
ended is never read (rule 6 comes first), where PyTorch, which trims out-of-range
indices only after checking for duplicates, counts ``0,5,0`` on a two-GPU host as no
device and this module sees GPU 0.

Indices are nvidia-smi's ordinals, as the guide says. CUDA's own enumeration can differ
(``CUDA_DEVICE_ORDER=FASTEST_FIRST``, its default) on a host that mixes GPU models; set
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` there so indices mean the same GPU to every tool.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_INDEX = re.compile(r"\s*\+?([0-9]+)")
_OLD_MIG = re.compile(r"^MIG-(GPU-[^/]+)/([0-9]+)/([0-9]+)$")


@dataclass(frozen=True)
class MigInstance:
    """A MIG device (one compute instance of one GPU instance) of a host GPU; its name
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb") and memory where NVML said them."""

    uuid: str  # "MIG-..."
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    name: str = ""
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class HostGPU:
    """One GPU as NVML lists it: its index, its UUID ("GPU-..."), its MIG devices."""

    index: int
    uuid: str
    mig: tuple[MigInstance, ...] = ()


@dataclass(frozen=True)
class Device:
    """One device the process sees: the physical GPU (its NVML index), and the MIG
    instance on it when the process sees an instance rather than the whole GPU."""

    gpu: int
    mig: MigInstance | None = None


@dataclass(frozen=True)
class Scope:
    """What a process sees: ``devices`` in CUDA's order, and ``note``, a sentence for a
    person when the value hid some of what it lists (empty when it did not)."""

    value: str | None
    devices: tuple[Device, ...]
    note: str = ""

    @property
    def gpus(self) -> list[int]:
        """The physical GPUs (NVML indices) the devices run on, in order, each once."""
        return list(dict.fromkeys(d.gpu for d in self.devices))


def _mig_named(text: str, gpu: HostGPU, mig: MigInstance) -> bool:
    """Whether ``text`` (a ``MIG-`` entry, either format) names ``mig`` of ``gpu``."""
    old = _OLD_MIG.match(text)
    if old is None:
        return mig.uuid.startswith(text)
    instance = (mig.gpu_instance_id, mig.compute_instance_id)
    return gpu.uuid.startswith(old.group(1)) and instance == (int(old[2]), int(old[3]))


def _entry(text: str, kind: str, host: Sequence[HostGPU]) -> tuple[Device | None, str]:
    """The device ``text`` names in a list of ``kind``, or None and why it is invalid."""
    if kind == "index":
        match = _INDEX.match(text)
        if match is None:
            return None, "not an index"
        index = int(match.group(1))
        gpus = [Device(g.index) for g in host if g.index == index]
        why = f"this host has no GPU {index}"
    elif not text.startswith(kind):
        return None, f"not a {kind} UUID like the first entry"
    elif kind == "GPU-":
        gpus = [Device(g.index) for g in host if g.uuid.startswith(text)]
        why = "no GPU has that UUID" if not gpus else "more than one GPU's UUID starts so"
    else:
        gpus = [Device(g.index, m) for g in host for m in g.mig if _mig_named(text, g, m)]
        why = "no MIG instance has that UUID" if not gpus else "more than one MIG UUID starts so"
    return (gpus[0], "") if len(gpus) == 1 else (None, why)


def scope(value: str | None, host: Sequence[HostGPU]) -> Scope:
    """The devices a process with ``CUDA_VISIBLE_DEVICES=value`` (None: unset) sees on a
    host with GPUs ``host``, by the rules in the module docstring."""
    if value is None:
        return Scope(value, tuple(Device(g.index) for g in host))
    entries = value.split(",")
    kind = next((p for p in ("GPU-", "MIG-") if value.startswith(p)), "index")
    devices: list[Device] = []
    notes: list[str] = []
    for position, text in enumerate(entries):
        device, why = _entry(text, kind, host)
        if device is None:
            if value:
                rest = ", what follows it is ignored" if position < len(entries) - 1 else ""
                notes.append(f"the list ends at {text!r} ({why}){rest}")
            break
        if device in devices:
            return Scope(value, (), f"{text!r} is listed twice: no device is visible")
        devices.append(device)
    if sum(d.mig is not None for d in devices) > 1:
        notes.append("a process enumerates one MIG device: the first listed")
        devices = devices[:1]
    return Scope(value, tuple(devices), "; ".join(notes))


def describe(s: Scope, host_count: int) -> str:
    """One line for a person: what ``CUDA_VISIBLE_DEVICES`` left visible of the host's
    ``host_count`` GPUs, and why ("" when it is unset)."""
    if s.value is None:
        return ""
    n = len(s.devices)
    seen = f"{n} device{'s' * (n != 1)} visible" if n else "no GPU is visible"
    seen += f" (the host has {host_count} GPU{'s' * (host_count != 1)})"
    return f"CUDA_VISIBLE_DEVICES={s.value!r}: {seen}" + (f"; {s.note}" if s.note else "")
