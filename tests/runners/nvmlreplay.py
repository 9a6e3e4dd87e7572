"""A recorded NVML session answered through pynvml's own call names (data, not a mock of our
code): ``runners.nvml`` reads it exactly as it reads the driver.

A recording is ``runners.nvml.Sampler.recording()`` (what ``python -m runners gpu-check
--record FILE`` writes): the devices, then one raw reading per GPU per sample, each field
as NVML returned it (None: the GPU answered NVML_ERROR_NOT_SUPPORTED). Sample ``i`` is
served until GPU 0's power is asked again, which is where every ``GPUs.read()`` starts;
after the last sample the last one is served. Errors are pynvml's real exception classes.

A device may also list its MIG devices (``"mig": [{"uuid", "gpu_instance_id",
"compute_instance_id", "name", "memory_total_bytes"}]``: MIG mode on) and the facts the
environment records (``compute_capability`` as [major, minor], ``memory_bus_width_bits``,
``memory_clock_max_mhz``, ``cpu_affinity`` as a CPU list like "0-55,112-167": the cores
``nvidia-smi topo -m`` calls the GPU's CPU affinity); without them NVML answers
NOT_SUPPORTED, as an older board's does. ``cuda_driver_version`` (NVML's integer, 12040
for 12.4) sits beside ``driver``.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from runners.conditions import parse_cpu_list

DATA = Path(__file__).parent / "data"


def recording(name: str = "nvml-2xh200-synthetic.json") -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


class Replay:
    NVMLError = pynvml.NVMLError
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE

    def __init__(self, data: dict[str, Any], init_error: int | None = None) -> None:
        self.data = data
        self.init_error = init_error
        self.cursor = -1
        self.initialised = 0
        self.calls = 0

    # ----------------------------------------------------------------- plumbing

    def _fail(self, code: int) -> None:
        raise pynvml.NVMLError(code)

    def _value(self, handle: int, field: str) -> Any:
        self.calls += 1
        samples = self.data["samples"]
        sample = samples[min(max(self.cursor, 0), len(samples) - 1)]
        value = sample["gpus"][handle].get(field)
        if value is None:
            self._fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def _device(self, handle: int) -> dict[str, Any]:
        return self.data["devices"][handle]

    def _fact(self, handle: int, key: str) -> Any:
        value = self._device(handle).get(key)
        if value is None:
            self._fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def _mig(self, handle: tuple[int, int], key: str) -> Any:
        parent, i = handle
        value = self._device(parent)["mig"][i].get(key)
        if value is None:
            self._fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    # ----------------------------------------------------------------- pynvml's calls (its names)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            self._fail(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.data.get("driver", "unknown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.data["devices"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int | tuple[int, int]) -> str:
        if isinstance(handle, tuple):  # a MIG device
            return self._mig(handle, "name")
        return self._device(handle)["name"]

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        if "cuda_driver_version" not in self.data:
            self._fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.data["cuda_driver_version"]

    def nvmlDeviceGetUUID(self, handle: int | tuple[int, int]) -> str:
        if isinstance(handle, tuple):  # a MIG device
            return self._mig(handle, "uuid")
        return self._device(handle)["uuid"]

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        major, minor = self._fact(handle, "compute_capability")
        return major, minor

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:
        return self._fact(handle, "memory_bus_width_bits")

    def nvmlDeviceGetMaxClockInfo(self, handle: int, kind: int) -> int:
        return self._fact(handle, "memory_clock_max_mhz")

    def nvmlDeviceGetMigMode(self, handle: int) -> tuple[int, int]:
        if self._device(handle).get("mig") is None:
            self._fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, index: int) -> tuple[int, int]:
        if index >= len(self._device(handle).get("mig") or []):
            self._fail(pynvml.NVML_ERROR_NOT_FOUND)
        return handle, index

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple[int, int]) -> int:
        return self._mig(handle, "gpu_instance_id")

    def nvmlDeviceGetComputeInstanceId(self, handle: tuple[int, int]) -> int:
        return self._mig(handle, "compute_instance_id")

    def nvmlDeviceGetCpuAffinity(self, handle: int, words: int) -> list[int]:
        """The device's ``cpu_affinity`` ("0-55,112-167") as NVML's 64-bit mask words."""
        cpus = parse_cpu_list(self._fact(handle, "cpu_affinity"))
        return [sum(1 << (c - 64 * w) for c in cpus if c // 64 == w) for w in range(words)]

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return int(self._device(handle)["power_limit_w"] * 1000)

    def nvmlDeviceGetMemoryInfo(self, handle: int | tuple[int, int]) -> SimpleNamespace:
        if isinstance(handle, tuple):  # a MIG device: its own share of the memory
            total = self._mig(handle, "memory_total_bytes")
            return SimpleNamespace(total=total, used=0, free=total)
        total = self._device(handle)["memory_total_bytes"]
        if self.cursor < 0:  # at open: only the total is read
            return SimpleNamespace(total=total, used=0, free=total)
        used = self._value(handle, "memory_used_bytes")
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        if handle == 0:
            self.cursor += 1
        return self._value(handle, "power_mw")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self._value(handle, "energy_mj")

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        gpu = self._value(handle, "gpu_util_pct")
        return SimpleNamespace(gpu=gpu, memory=self._value(handle, "mem_util_pct"))

    def nvmlDeviceGetClockInfo(self, handle: int, kind: int) -> int:
        field = "sm_clock_mhz" if kind == pynvml.NVML_CLOCK_SM else "mem_clock_mhz"
        return self._value(handle, field)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return self._value(handle, "temperature_c")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return self._value(handle, "clock_reasons")
