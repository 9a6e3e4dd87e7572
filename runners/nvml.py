"""NVIDIA GPU telemetry through NVML (``nvidia-ml-py``): the one module that talks to it.

Every ``interval_s`` (0.1 s), for every GPU the run uses, ``Sampler`` reads (``FIELDS``):

===================  ==========================================  ==========================
field                NVML call                                   unit
===================  ==========================================  ==========================
power_mw             nvmlDeviceGetPowerUsage                     mW (some boards: a 1 s mean)
energy_mj            nvmlDeviceGetTotalEnergyConsumption         mJ since the driver loaded
gpu_util_pct         nvmlDeviceGetUtilizationRates().gpu         % of the last period a
                                                                 kernel ran (not occupancy)
mem_util_pct         nvmlDeviceGetUtilizationRates().memory      % of it memory was busy
sm_clock_mhz         nvmlDeviceGetClockInfo(NVML_CLOCK_SM)       MHz
mem_clock_mhz        nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)      MHz
memory_used_bytes    nvmlDeviceGetMemoryInfo().used              bytes
temperature_c        nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)  °C
clock_reasons        nvmlDeviceGetCurrentClocksEventReasons      bitmask (``REASONS``)
===================  ==========================================  ==========================

A field a GPU does not support (any ``NVMLError``) reads None and is not asked again, so
an old board costs no failing call per sample.

**Which GPUs.** NVML lists every GPU of the node; the run uses those its
``CUDA_VISIBLE_DEVICES`` names, read by CUDA's rules (``runners.gpu_scope``: indices,
``GPU-`` UUIDs and prefixes, MIG instances, the list ending at an invalid entry), and only
those are read; ``note`` says what the variable hid. A MIG instance is read through its
whole GPU (NVML's power, energy and utilisation are per physical GPU, so other
instances' work counts too: ``note`` says so). No visible GPU is "not measured", with
the reason. On Kubernetes the device plugin already hides the GPUs a Pod was not given.

**Topology** (``read_topology``): the node's GPUs and each one's nearest CPUs
(``nvmlDeviceGetCpuAffinity``), what ``runners.placement`` deals out to the local
executor's slots.

**Energy over a window** (``summarize``): the total-energy counter's difference,
interpolated linearly at the window's ends; where a GPU has no counter (before Volta),
the integral of its power samples (trapezoids), and ``energy_source`` says which.

**Where it runs.** In a thread of the runner's own process, never in the process being
measured (no GIL shared with the HF loop, no CPU taken from the bench client's process);
its thread CPU time is recorded as its cost.

**Recordings.** ``Sampler.recording()`` is the raw readings as NVML returned them
(``{"devices": [...], "samples": [{"t", "gpus": [{field: value}]}]}``); ``python -m
runners gpu-check --record FILE`` writes one, and the tests replay one through the same
calls (``tests/runners/nvmlreplay.py``). The code below is unverified on hardware until
such a recording from a real GPU replaces the synthetic one in ``tests/runners/data``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from runners import gpu_scope

T = TypeVar("T")

NOT_MEASURED = "not measured (no NVML)"
DEFAULT_INTERVAL_S = 0.1

FIELDS = (
    "power_mw",
    "energy_mj",
    "gpu_util_pct",
    "mem_util_pct",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "memory_used_bytes",
    "temperature_c",
    "clock_reasons",
)
# nvmlClocksEventReason* bits (stable across NVML releases).
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


class NVMLUnavailable(RuntimeError):
    """NVML cannot be read here; the message says why, for a person."""


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    uuid: str
    power_limit_w: float | None = None
    memory_total_bytes: int | None = None


def load_library() -> Any:
    try:
        import pynvml
    except ImportError:
        raise NVMLUnavailable("nvidia-ml-py (pynvml) is not installed") from None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _maybe(lib: Any, call: Callable[[], Any]) -> Any:
    """``call()``, or None where the GPU (or this NVML) does not answer it."""
    try:
        return call()
    except lib.NVMLError:
        return None


def _mig_instances(lib: Any, handle: Any) -> tuple[gpu_scope.MigInstance, ...]:
    """The MIG devices of a GPU with MIG enabled (none otherwise, or where NVML cannot
    tell: a board or a driver without MIG)."""
    mode = _maybe(lib, lambda: lib.nvmlDeviceGetMigMode(handle))
    if not mode or mode[0] != lib.NVML_DEVICE_MIG_ENABLE:
        return ()
    out = []
    for i in range(_maybe(lib, lambda: lib.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0):
        mig = _maybe(lib, lambda i=i: lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, i))
        if mig is None:  # an empty slot
            continue
        name = _maybe(lib, lambda mig=mig: lib.nvmlDeviceGetName(mig))
        out.append(
            gpu_scope.MigInstance(
                uuid=_text(lib.nvmlDeviceGetUUID(mig)),
                gpu_instance_id=_maybe(lib, lambda mig=mig: lib.nvmlDeviceGetGpuInstanceId(mig)),
                compute_instance_id=_maybe(
                    lib, lambda mig=mig: lib.nvmlDeviceGetComputeInstanceId(mig)
                ),
                name=_text(name) if name is not None else "",
                memory_total_bytes=_maybe(
                    lib, lambda mig=mig: int(lib.nvmlDeviceGetMemoryInfo(mig).total)
                ),
            )
        )
    return tuple(out)


def host_gpus(lib: Any, handles: list[Any]) -> list[gpu_scope.HostGPU]:
    """The node's GPUs as ``runners.gpu_scope`` reads them (index, UUID, MIG devices),
    from NVML handles by index (``nvmlInit`` done)."""
    return [
        gpu_scope.HostGPU(i, _text(lib.nvmlDeviceGetUUID(h)), _mig_instances(lib, h))
        for i, h in enumerate(handles)
    ]


def with_gpus(read: Callable[[Any, list[Any]], T], lib: Any = None) -> T | None:
    """``read(lib, handles)`` with NVML initialised (``lib``, default pynvml) and the
    node's GPU handles by index, NVML shut down after; None where NVML cannot be read
    here (no ``nvidia-ml-py``, no driver, an NVML error on the way)."""
    try:
        lib = lib or load_library()
    except NVMLUnavailable:
        return None
    try:
        lib.nvmlInit()
    except lib.NVMLError:
        return None
    try:
        return read(
            lib, [lib.nvmlDeviceGetHandleByIndex(i) for i in range(lib.nvmlDeviceGetCount())]
        )
    except lib.NVMLError:
        return None
    finally:
        lib.nvmlShutdown()


def read_host_gpus(lib: Any = None) -> list[gpu_scope.HostGPU] | None:
    """``host_gpus`` of this node; None where NVML cannot be read here."""
    return with_gpus(host_gpus, lib)


# CPUs NVML's affinity masks cover: 64-bit words (pynvml's c_ulonglong), enough for 1,024.
_AFFINITY_WORDS = 16


def cpu_affinity(lib: Any, handle: Any) -> frozenset[int] | None:
    """The CPUs nearest a GPU (``nvmlDeviceGetCpuAffinity``: its NUMA node's cores, as
    ``nvidia-smi topo -m`` prints them); None where NVML does not say."""
    words = _maybe(lib, lambda: lib.nvmlDeviceGetCpuAffinity(handle, _AFFINITY_WORDS))
    if words is None:
        return None
    cpus = {64 * i + bit for i, word in enumerate(words) for bit in range(64) if word >> bit & 1}
    return frozenset(cpus) or None


def topology(
    lib: Any, handles: list[Any]
) -> tuple[list[gpu_scope.HostGPU], dict[int, frozenset[int]]]:
    """The node's GPUs (``host_gpus``) and each one's nearest CPUs (where NVML says)."""
    near = {i: cpu_affinity(lib, h) for i, h in enumerate(handles)}
    return host_gpus(lib, handles), {i: c for i, c in near.items() if c}


def read_topology(
    lib: Any = None,
) -> tuple[list[gpu_scope.HostGPU], dict[int, frozenset[int]]] | None:
    """``topology`` of this node; None where NVML cannot be read here."""
    return with_gpus(topology, lib)


def _note(chosen: gpu_scope.Scope, host: int) -> str:
    """What the scope hid, and that a MIG instance is read through its whole GPU."""
    notes = [gpu_scope.describe(chosen, host)] if chosen.note else []
    migs = [d.mig.uuid for d in chosen.devices if d.mig is not None]
    if migs:
        notes.append(
            f"MIG instance {', '.join(migs)}: its whole GPU is read (NVML measures power, "
            "energy and utilisation per GPU), other instances' work included"
        )
    return "; ".join(notes)


class GPUs:
    """Open NVML handles to the GPUs the run uses; ``read()`` is one raw sample of each."""

    def __init__(self, lib: Any, handles: list[Any], devices: list[Device], note: str = ""):
        self.lib = lib
        self.handles = handles
        self.devices = devices
        self.note = note
        self._unsupported: set[str] = set()
        self._table = [self._calls(h) for h in handles]

    @classmethod
    def open(cls, lib: Any = None, visible: str | None = None) -> GPUs:
        """NVML initialised and the GPUs ``visible`` (``CUDA_VISIBLE_DEVICES``' syntax;
        None: all) found; NVMLUnavailable says why not."""
        lib = lib or load_library()
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            raise NVMLUnavailable(f"NVML did not initialise: {exc}") from None
        try:
            handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(lib.nvmlDeviceGetCount())]
            found = gpu_scope.scope(visible, host_gpus(lib, handles))
            chosen = found.gpus
            if not chosen:
                raise NVMLUnavailable(
                    gpu_scope.describe(found, len(handles)) if handles else "NVML found no GPU"
                )
            note = _note(found, len(handles))
            devices = [cls._device(lib, handles[i], i) for i in chosen]
        except lib.NVMLError as exc:
            lib.nvmlShutdown()
            raise NVMLUnavailable(f"NVML could not list the GPUs: {exc}") from None
        except NVMLUnavailable:
            lib.nvmlShutdown()
            raise
        return cls(lib, [handles[i] for i in chosen], devices, note)

    @staticmethod
    def _device(lib: Any, handle: Any, index: int) -> Device:
        limit = _maybe(lib, lambda: lib.nvmlDeviceGetEnforcedPowerLimit(handle))
        memory = _maybe(lib, lambda: lib.nvmlDeviceGetMemoryInfo(handle).total)
        return Device(
            index=index,
            name=_text(lib.nvmlDeviceGetName(handle)),
            uuid=_text(lib.nvmlDeviceGetUUID(handle)),
            power_limit_w=limit / 1000.0 if limit is not None else None,
            memory_total_bytes=int(memory) if memory is not None else None,
        )

    def _calls(self, h: Any) -> list[tuple[tuple[str, ...], Callable[[], tuple[Any, ...]]]]:
        """(fields, call returning their values): one NVML call per group of fields."""
        lib = self.lib
        # The newer name; the older one is deprecated (removed with CUDA 14).
        reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = reasons or lib.nvmlDeviceGetCurrentClocksThrottleReasons

        def util() -> tuple[Any, Any]:
            rates = lib.nvmlDeviceGetUtilizationRates(h)
            return rates.gpu, rates.memory

        return [
            (("power_mw",), lambda: (lib.nvmlDeviceGetPowerUsage(h),)),
            (("energy_mj",), lambda: (lib.nvmlDeviceGetTotalEnergyConsumption(h),)),
            (("gpu_util_pct", "mem_util_pct"), util),
            (("sm_clock_mhz",), lambda: (lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM),)),
            (("mem_clock_mhz",), lambda: (lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_MEM),)),
            (("memory_used_bytes",), lambda: (lib.nvmlDeviceGetMemoryInfo(h).used,)),
            (
                ("temperature_c",),
                lambda: (lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU),),
            ),
            (("clock_reasons",), lambda: (reasons(h),)),
        ]

    def read(self) -> list[dict[str, int | None]]:
        """One raw reading per GPU, as NVML returned it (None: not supported)."""
        out = []
        for i, calls in enumerate(self._table):
            sample: dict[str, int | None] = {}
            for names, call in calls:
                key = f"{i}:{names[0]}"
                values: tuple[Any, ...] = (None,) * len(names)
                if key not in self._unsupported:
                    try:
                        values = tuple(int(v) for v in call())
                    except self.lib.NVMLError:
                        self._unsupported.add(key)
                sample.update(zip(names, values, strict=True))
            out.append(sample)
        return out

    def close(self) -> None:
        with contextlib.suppress(self.lib.NVMLError):
            self.lib.nvmlShutdown()


class Sampler:
    """Samples the GPUs in a background thread while a measurement runs.

    ``with Sampler() as s: ...`` then ``s.series()``, ``s.status``, ``s.cpu_s``. Where NVML
    cannot be read, nothing runs and ``status`` is ``NOT_MEASURED`` with the reason; with
    ``off`` (why this machine's GPUs are not the measured ones: an endpoint's server runs
    elsewhere) nothing runs and ``status`` says that.
    """

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        lib: Any = None,
        clock: Callable[[], float] = time.perf_counter,
        off: str | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self.off = off
        self.status = "ok"
        self.note = ""
        self.cpu_s = 0.0
        self.t0: float | None = None
        self._lib = lib
        self._gpus: GPUs | None = None
        self._samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="servebench-nvml", daemon=True)

    @property
    def available(self) -> bool:
        return self._gpus is not None

    @property
    def devices(self) -> list[Device]:
        return self._gpus.devices if self._gpus else []

    def _sample(self) -> None:
        assert self._gpus is not None
        before = self.clock()
        gpus = self._gpus.read()
        self._samples.append({"t": (before + self.clock()) / 2, "gpus": gpus})

    def _loop(self) -> None:
        start = time.thread_time()
        try:
            while not self._stop.wait(self.interval_s):
                self._sample()
        finally:
            self.cpu_s += time.thread_time() - start

    def __enter__(self) -> Sampler:
        self.t0 = self.clock()
        if self.off is not None:
            self.status = f"not measured: {self.off}"
            return self
        try:
            self._gpus = GPUs.open(self._lib, os.environ.get("CUDA_VISIBLE_DEVICES"))
        except NVMLUnavailable as exc:
            self.status = f"{NOT_MEASURED}: {exc}"
            return self
        self.note = self._gpus.note
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._gpus is None:
            return
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()
        self._gpus.close()

    def memory_peak_bytes(self) -> int | None:
        """The most device memory in use at once, summed over the GPUs."""
        totals = [
            sum(g["memory_used_bytes"] or 0 for g in s["gpus"])
            for s in self._samples
            if any(g["memory_used_bytes"] is not None for g in s["gpus"])
        ]
        return max(totals) if totals else None

    def recording(self) -> dict[str, Any]:
        """The raw readings (the format the tests replay)."""
        return {
            "devices": [asdict(d) for d in self.devices],
            "interval_s": self.interval_s,
            "samples": self._samples,
        }

    def series(self) -> dict[str, Any]:
        """The stored time series: t relative to ``t0``, one list per GPU and field."""
        if self._gpus is None:
            return {"status": self.status}
        return {
            **series_from_recording(self.recording(), self.t0 or 0.0),
            "status": self.status,
            **({"note": self.note} if self.note else {}),
        }


# --------------------------------------------------------------------------- pure functions

_SCALE = {"power_mw": ("power_w", 1e-3), "memory_used_bytes": ("memory_used_mib", 2**-20)}


def series_from_recording(recording: dict[str, Any], t0: float) -> dict[str, Any]:
    """Raw readings -> columns: ``t`` (s after ``t0``), then per field one list per GPU in
    display units (W, J since the first sample, %, MHz, MiB, °C, reason bitmask); a field a
    GPU never reported is None."""
    samples = recording.get("samples") or []
    devices = recording.get("devices") or []
    out: dict[str, Any] = {
        "interval_s": recording.get("interval_s"),
        "devices": devices,
        "t": [round(s["t"] - t0, 4) for s in samples],
    }
    for field in FIELDS:
        name, scale = _SCALE.get(field, (field.removesuffix("_pct"), 1.0))
        if field == "energy_mj":
            name = "energy_j"
        columns: list[list[float | None] | None] = []
        for gpu in range(len(devices)):
            values = [s["gpus"][gpu].get(field) for s in samples]
            if all(v is None for v in values):
                columns.append(None)
                continue
            if field == "energy_mj":
                first = next(v for v in values if v is not None)
                columns.append([None if v is None else (v - first) / 1000.0 for v in values])
            else:
                columns.append([None if v is None else round(v * scale, 3) for v in values])
        out[name] = columns
    return out


def _at(ts: Sequence[float], ys: Sequence[float | None], t: float) -> float | None:
    """``ys`` linearly interpolated at ``t`` (clamped to the ends; None-free pairs only)."""
    pairs = [(x, y) for x, y in zip(ts, ys, strict=True) if y is not None]
    if not pairs:
        return None
    xs = [p[0] for p in pairs]
    i = bisect_left(xs, t)
    if i == 0:
        return pairs[0][1]
    if i >= len(pairs):
        return pairs[-1][1]
    (x0, y0), (x1, y1) = pairs[i - 1], pairs[i]
    return y0 if x1 == x0 else y0 + (y1 - y0) * (t - x0) / (x1 - x0)


def _integral(ts: Sequence[float], ys: Sequence[float | None], lo: float, hi: float) -> float:
    """Trapezoid integral of ``ys`` over [lo, hi], the ends interpolated."""
    inside = [(t, y) for t, y in zip(ts, ys, strict=True) if lo < t < hi and y is not None]
    points = [(lo, _at(ts, ys, lo)), *inside, (hi, _at(ts, ys, hi))]
    total = 0.0
    for (t0, y0), (t1, y1) in itertools.pairwise(points):
        if y0 is not None and y1 is not None:
            total += (y0 + y1) / 2 * (t1 - t0)
    return total


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def reason_names(mask: int) -> list[str]:
    return [name for bit, name in REASONS.items() if mask & bit]


def summarize(series: dict[str, Any], window: tuple[float, float]) -> dict[str, Any]:
    """The GPU facts of one measurement over ``window`` (s, on the series' ``t`` axis):
    energy (J, all GPUs), mean and peak power (W), mean utilisation (fractions), mean
    clocks, peak temperature and memory, and every clock-event reason seen."""
    ts: list[float] = series.get("t") or []
    lo, hi = window
    gpus = len(series.get("devices") or [])
    out: dict[str, Any] = {"gpus": gpus, "window_s": round(hi - lo, 4)}
    if not ts or gpus == 0 or hi <= lo:
        return out
    energy, sources = 0.0, set()
    for g in range(gpus):
        counter = (series.get("energy_j") or [None] * gpus)[g]
        power = (series.get("power_w") or [None] * gpus)[g]
        e0, e1 = (_at(ts, counter, lo), _at(ts, counter, hi)) if counter else (None, None)
        if e0 is not None and e1 is not None:
            energy += e1 - e0
            sources.add("counter")
        elif power:
            energy += _integral(ts, power, lo, hi)
            sources.add("power integral")
        else:
            sources.add("none")
    if "none" not in sources:
        out["energy_j"] = energy
        out["energy_source"] = " + ".join(sorted(sources))
        out["avg_power_w"] = energy / (hi - lo)
    inside = [i for i, t in enumerate(ts) if lo <= t <= hi]
    out["samples"] = len(inside)

    def per_sample(name: str, combine: Callable[[list[float]], float]) -> list[float]:
        columns = [c for c in series.get(name) or [] if c]
        values = []
        for i in inside:
            row = [c[i] for c in columns if c[i] is not None]
            if row:
                values.append(combine(row))
        return values

    power_sums = per_sample("power_w", math.fsum)
    if power_sums:
        out["peak_power_w"] = max(power_sums)
    for key, name, scale in (
        ("gpu_util", "gpu_util", 0.01),
        ("mem_util", "mem_util", 0.01),
        ("sm_clock_mhz", "sm_clock_mhz", 1.0),
        ("mem_clock_mhz", "mem_clock_mhz", 1.0),
    ):
        mean = _mean(per_sample(name, lambda row: math.fsum(row) / len(row)))
        if mean is not None:
            out[key] = mean * scale
    temps = per_sample("temperature_c", max)
    if temps:
        out["temperature_max_c"] = max(temps)
    memory = per_sample("memory_used_mib", math.fsum)
    if memory:
        out["memory_used_peak_bytes"] = int(max(memory) * 2**20)
    masks = per_sample("clock_reasons", lambda row: float(_or(row)))
    out["clock_reasons"] = reason_names(_or(masks)) if masks else []
    return out


def _or(values: Sequence[float]) -> int:
    mask = 0
    for v in values:
        mask |= int(v)
    return mask
