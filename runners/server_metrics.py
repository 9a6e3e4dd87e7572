"""vLLM server metrics around one sweep point: /metrics deltas, sampled peaks, GPU memory.

The bench client sees latency from outside; the server explains it. Around each point:

- counters are read before and after (``vllm:num_preemptions_total``, prefix-cache
  queries and hits), the difference belongs to the point; V1 logs nothing when it
  preempts, so the counter is the only witness;
- gauges are sampled by a background thread while the point runs, keeping the peak
  (KV-cache usage: ``vllm:kv_cache_usage_perc``, older releases
  ``vllm:gpu_cache_usage_perc``; requests running and waiting);
- GPU memory in use is sampled through NVML when a GPU exists (all visible devices
  summed, so tensor parallelism counts every shard).

Series with several label sets (one per engine) are summed, except usage, which is a
fraction and takes the maximum.

Cost matters because the sampler shares the machine with the server: vLLM renders ~60 kB
of metrics per scrape (~15 ms of the API server's time on a small CPU), so sampling is
once a second, and only the handful of series used here are parsed (prometheus_client's
full parser took longer than the scrape itself).
"""

from __future__ import annotations

import re
import threading
from typing import Any

import requests

from runners.result import ServerMetrics

PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WANTED = (PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS, *KV_USAGE, RUNNING, WAITING)
_MAX_SERIES = {*KV_USAGE}


def parse(text: str, wanted: tuple[str, ...] = WANTED) -> dict[str, float]:
    """The ``wanted`` samples of a Prometheus text exposition, label sets combined.

    Lines are ``name{labels} value [timestamp]``; label values may hold spaces, so the
    value is read after the closing brace.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(wanted):
            continue
        brace = line.find("{")
        if brace >= 0:
            name, rest = line[:brace], line[line.rindex("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        if name not in wanted:
            continue  # a longer name with a wanted prefix
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if name in out:
            out[name] = max(out[name], value) if name in _MAX_SERIES else out[name] + value
        else:
            out[name] = value
    return out


CACHE_CONFIG = "vllm:cache_config_info"
KV_CACHE_FIELDS = (
    "num_gpu_blocks", "block_size", "kv_cache_memory_bytes", "cache_dtype",
    "gpu_memory_utilization",
)  # fmt: skip
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def cache_config(text: str) -> dict[str, float | str]:
    """The KV cache vLLM actually allocated, from the ``vllm:cache_config_info`` labels.

    ``num_gpu_blocks`` x ``block_size`` is the cache's capacity in tokens: what the
    portal's capacity planning compares with the model's KV bytes per token. Blocks are
    summed over engines (data parallelism); the other fields are taken as reported.
    """
    out: dict[str, float | str] = {}
    for line in text.splitlines():
        if not line.startswith(CACHE_CONFIG + "{"):
            continue
        labels = dict(_LABEL.findall(line[line.find("{") : line.rindex("}") + 1]))
        for key in KV_CACHE_FIELDS:
            value = labels.get(key)
            if value in (None, "", "None"):
                continue
            try:
                number = float(value)
            except ValueError:
                out[key] = value
                continue
            if key in ("num_gpu_blocks", "kv_cache_memory_bytes") and key in out:
                out[key] = float(out[key]) + number
            else:
                out[key] = number
    return out


def scrape_text(base_url: str, timeout_s: float = 5.0) -> str:
    response = requests.get(f"{base_url}/metrics", timeout=timeout_s)
    response.raise_for_status()
    return response.text


def scrape(base_url: str, timeout_s: float = 5.0) -> dict[str, float]:
    return parse(scrape_text(base_url, timeout_s))


def _kv_usage(sample: dict[str, float]) -> float | None:
    return next((sample[name] for name in KV_USAGE if name in sample), None)


class _GPUMemory:
    """NVML memory-in-use reader; inert where there is no NVIDIA driver."""

    def __init__(self) -> None:
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception:  # ImportError or any NVMLError: no GPU to watch
            self._handles = []

    def used_bytes(self) -> int | None:
        if not self._handles:
            return None
        return sum(int(self._nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self._handles)

    def close(self) -> None:
        if self._handles:
            self._nvml.nvmlShutdown()
            self._handles = []


class PointWatcher:
    """Context manager measuring the server during one point.

    ``with PointWatcher(url) as w: run_point()`` then ``w.result()`` and ``w.gpu_peak``.
    Scrape failures never fail the point: a missing metric is recorded as None.
    """

    def __init__(self, base_url: str, interval_s: float = 1.0) -> None:
        self.base_url = base_url
        self.interval_s = interval_s
        self.gpu_peak: int | None = None
        self._before: dict[str, float] = {}
        self._after: dict[str, float] = {}
        self._peaks: dict[str, float] = {}
        self._samples = 0
        self._cache: dict[str, float | str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="servebench-metrics", daemon=True)
        self._gpu = _GPUMemory()

    def _safe_scrape(self) -> dict[str, float]:
        try:
            return scrape(self.base_url)
        except (requests.RequestException, ValueError):
            return {}

    def _sample(self) -> None:
        sample = self._safe_scrape()
        used = self._gpu.used_bytes()
        if used is not None:
            self.gpu_peak = max(self.gpu_peak or 0, used)
        if not sample:
            return
        self._samples += 1
        for key, value in (
            ("kv", _kv_usage(sample)),
            ("running", sample.get(RUNNING)),
            ("waiting", sample.get(WAITING)),
        ):
            if value is not None:
                self._peaks[key] = max(self._peaks.get(key, value), value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> PointWatcher:
        try:
            text = scrape_text(self.base_url)
            self._before, self._cache = parse(text), cache_config(text)
        except (requests.RequestException, ValueError):
            self._before = {}
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()
        self._after = self._safe_scrape()
        self._gpu.close()

    def _delta(self, name: str) -> float | None:
        if name in self._before and name in self._after:
            return self._after[name] - self._before[name]
        return None

    def result(self) -> ServerMetrics:
        queries, hits = self._delta(PREFIX_QUERIES), self._delta(PREFIX_HITS)
        return ServerMetrics(
            preemptions=self._delta(PREEMPTIONS),
            prefix_cache_queries=queries,
            prefix_cache_hits=hits,
            prefix_cache_hit_rate=(hits / queries) if queries and hits is not None else None,
            kv_cache_usage_peak=self._peaks.get("kv"),
            num_requests_running_peak=self._peaks.get("running"),
            num_requests_waiting_peak=self._peaks.get("waiting"),
            samples=self._samples,
            **self._cache,
        )
