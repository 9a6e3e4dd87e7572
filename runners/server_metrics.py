"""vLLM server metrics around one sweep point: /metrics deltas, sampled peaks, GPU memory.

The bench client sees latency from outside; the server explains it. Around each point:

- counters are read before and after (``vllm:num_preemptions_total``, prefix-cache
  queries and hits), the difference belongs to the point; V1 logs nothing when it
  preempts, so the counter is the only witness;
- gauges and counters are sampled by a background thread every ``interval_s`` (0.1 s)
  while the point runs: the peaks (KV-cache usage: ``vllm:kv_cache_usage_perc``, older
  releases ``vllm:gpu_cache_usage_perc``; requests running and waiting), the mean number
  of requests running over the samples where any ran (the batch decode really had, which
  the roofline uses instead of assuming the client's concurrency), and the time
  series the run page draws (``series()``: those gauges, and preemptions and prefix-cache
  hits and queries since the point began), enough samples to show a one-second point's
  ramp;
- the GPUs are sampled through NVML when there are any (``runners.nvml``: power, energy,
  utilisation, clocks, memory, temperature, throttle reasons; GPU memory in use summed
  over the visible devices, so tensor parallelism counts every shard).

Series with several label sets (one per engine) are summed, except usage, which is a
fraction and takes the maximum.

Cost matters because the sampler shares the machine with the server. A full ``/metrics``
is ~60 kB that the API server renders (~5-7 ms of its CPU per scrape on this project's
2-core machines); ``/metrics/?name[]=...`` (prometheus_client's filter, reached through
the mount vLLM adds: the bare ``/metrics`` route ignores it) renders only the series used
here: ~1.3 kB and ~0.65 ms, which is what makes 10 samples a second cheap. A server whose
filtered answer lacks them (an older release, a multiprocess registry) is scraped in full
from then on. Only the wanted lines are parsed (prometheus_client's full parser took
longer than the scrape itself), over one kept-alive connection, and the sampler thread's
own CPU time is recorded in the telemetry's ``sampler`` block.

Scrapes go only to the server's own origin and follow no redirect (``runners.egress``):
a ``/metrics`` that redirects is not scraped again, and the sampler block says why
(``scrape_refused``).
"""

from __future__ import annotations

import http.client
import re
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

import requests

from runners import nvml
from runners import telemetry as tm
from runners.egress import REDIRECT_STATUSES, Egress, EgressRefused, pinned_session
from runners.result import ServerMetrics

PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# Speculative decoding (absent unless the server speculates): drafts proposed, draft
# tokens proposed, draft tokens the target model accepted.
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_DECODE = (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED)
WANTED = (PREEMPTIONS, PREFIX_QUERIES, PREFIX_HITS, *KV_USAGE, RUNNING, WAITING, *SPEC_DECODE)
_MAX_SERIES = {*KV_USAGE}
DEFAULT_INTERVAL_S = 0.1
# prometheus_client's filter: the sample names wanted (``/metrics/?name[]=a&name[]=b``).
FILTER = {"name[]": list(WANTED)}
_FILTERED_PATH = "/metrics/?" + urlencode(FILTER, doseq=True)


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


def spec_decode(
    drafts: float | None, draft_tokens: float | None, accepted: float | None
) -> dict[str, float]:
    """Speculative decoding over a point, from the counters' deltas (empty when the server
    does not speculate or proposed nothing): ``spec_decode_acceptance_rate``, accepted
    draft tokens / proposed ones; ``spec_decode_mean_accepted_length``, tokens each
    verification step yields, 1 + accepted / drafts (the target's own token counts: 1 is
    no gain). The definitions of vLLM's bench client and its logs."""
    if not drafts or not draft_tokens or accepted is None:
        return {}
    return {
        "spec_decode_drafts": drafts,
        "spec_decode_draft_tokens": draft_tokens,
        "spec_decode_accepted_tokens": accepted,
        "spec_decode_acceptance_rate": min(accepted / draft_tokens, 1.0),
        "spec_decode_mean_accepted_length": 1.0 + accepted / drafts,
    }


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


def _label(base_url: str) -> str:
    return f"the server at {base_url}"


def scrape_text(base_url: str, timeout_s: float = 5.0) -> str:
    """The full ``/metrics`` text; ``requests.RequestException`` when it cannot be read
    (``runners.egress.EgressRefused`` for a redirect)."""
    session = pinned_session(base_url, _label(base_url))
    with session:
        response = session.get(f"{base_url}/metrics", timeout=timeout_s)
    response.raise_for_status()
    return response.text


def scrape(base_url: str, timeout_s: float = 5.0) -> dict[str, float]:
    return parse(scrape_text(base_url, timeout_s))


def _kv_usage(sample: dict[str, float]) -> float | None:
    return next((sample[name] for name in KV_USAGE if name in sample), None)


class _Connection:
    """One kept-alive HTTP connection for the sampler: ~0.2 ms of CPU per scrape where
    ``requests`` took ~1 ms (measured on this project's machines)."""

    def __init__(self, base_url: str, timeout_s: float = 5.0) -> None:
        self.egress = Egress([base_url], _label(base_url))
        self._base_url = base_url.rstrip("/")
        parts = urlsplit(base_url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port
        self._https = parts.scheme == "https"
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def get(self, path: str) -> tuple[int, str]:
        """(status, body) of ``GET path``; OSError / HTTPException when unreachable,
        ``EgressRefused`` for a redirect (never followed)."""
        for attempt in (0, 1):  # a kept-alive connection the server closed: reconnect once
            if self._conn is None:
                kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
                self._conn = kind(self._host, self._port, timeout=self._timeout_s)
            try:
                self._conn.request("GET", self._prefix + path)
                response = self._conn.getresponse()
                body = response.read().decode("utf-8", "replace")
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt:
                    raise
                continue
            if response.status in REDIRECT_STATUSES:
                location = response.getheader("Location")
                url = self._base_url + path
                raise self.egress.redirect_refused("GET", url, response.status, location)
            return response.status, body
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


# The time series' columns: name -> (series, kind). Counters are kept as the change since
# the point began, so the chart reads "preempted so far".
SERIES = {
    "running": (RUNNING, "gauge"),
    "waiting": (WAITING, "gauge"),
    "kv_cache_usage": (KV_USAGE, "gauge"),
    "preemptions": (PREEMPTIONS, "counter"),
    "prefix_cache_hits": (PREFIX_HITS, "counter"),
    "prefix_cache_queries": (PREFIX_QUERIES, "counter"),
}


class PointWatcher:
    """Context manager measuring the server (and the GPUs) during one point.

    ``with PointWatcher(url) as w: run_point()`` then ``w.result()``, ``w.gpu_peak`` and
    ``w.telemetry(detail)``. Scrape failures never fail the point: a missing metric is
    recorded as None.
    """

    def __init__(
        self,
        base_url: str,
        interval_s: float = DEFAULT_INTERVAL_S,
        gpu: nvml.Sampler | None = None,
    ) -> None:
        self.base_url = base_url
        self.interval_s = interval_s
        self.gpu_peak: int | None = None
        self.t0 = time.perf_counter()
        self._before: dict[str, float] = {}
        self._after: dict[str, float] = {}
        self._peaks: dict[str, float] = {}
        self._samples = 0
        self._series: list[tuple[float, dict[str, float]]] = []
        self._running: list[float] = []
        self._scrape_s: list[float] = []
        self._filtered = True
        self._exposed = True  # until /metrics answers 404: then no more scrapes
        self._cpu_s = 0.0
        self._refused = ""  # why /metrics is not scraped (a redirect), if so
        self._cache: dict[str, float | str] = {}
        self._http = _Connection(base_url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="servebench-metrics", daemon=True)
        self._gpu = gpu or nvml.Sampler()

    def _scrape(self) -> dict[str, float]:
        """The wanted series, filtered server-side while the server honours the filter."""
        if self._filtered:
            status, text = self._http.get(_FILTERED_PATH)
            found = parse(text) if status == 200 else {}
            if found:
                return found
            self._filtered = False  # not honoured here: the full exposition from now on
        status, text = self._http.get("/metrics")
        if status == 404:  # not exposed (transformers serve, many endpoints): stop asking
            self._exposed = False
        return parse(text) if status == 200 else {}

    def _safe_scrape(self) -> dict[str, float]:
        if not self._exposed:
            return {}
        try:
            return self._scrape()
        except requests.RequestException as exc:  # EgressRefused: a redirect, not followed
            self._exposed, self._refused = False, str(exc)
            return {}
        except (OSError, http.client.HTTPException, ValueError):
            return {}

    def _sample(self) -> None:
        start = time.perf_counter()
        sample = self._safe_scrape()
        end = time.perf_counter()
        if not sample:
            return
        self._samples += 1
        self._scrape_s.append(end - start)
        self._series.append(((start + end) / 2, sample))
        running = sample.get(RUNNING)
        if running:  # the point's busy samples: the batch decode had
            self._running.append(running)
        for key, value in (
            ("kv", _kv_usage(sample)),
            ("running", running),
            ("waiting", sample.get(WAITING)),
        ):
            if value is not None:
                self._peaks[key] = max(self._peaks.get(key, value), value)

    def _loop(self) -> None:
        start = time.thread_time()
        try:
            while self._exposed and not self._stop.wait(self.interval_s):
                self._sample()
        finally:
            self._cpu_s += time.thread_time() - start

    def __enter__(self) -> PointWatcher:
        self._gpu.__enter__()
        self.t0 = time.perf_counter()
        try:
            text = scrape_text(self.base_url)
            self._before, self._cache = parse(text), cache_config(text)
        except EgressRefused as exc:  # a redirect: never followed, never asked again
            self._before, self._exposed, self._refused = {}, False, str(exc)
        except (requests.RequestException, ValueError):
            self._before = {}
        if self._before:  # the series starts where the point does
            self._series.append(((self.t0 + time.perf_counter()) / 2, self._before))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()
        self._after = self._safe_scrape()
        self._http.close()
        self._gpu.__exit__(*exc)
        self.gpu_peak = self._gpu.memory_peak_bytes()

    def _delta(self, name: str) -> float | None:
        """A counter's change over the point; None when unknown (not reported, or lower
        after than before: the server restarted and the counter began again)."""
        if name in self._before and name in self._after:
            delta = self._after[name] - self._before[name]
            return delta if delta >= 0 else None
        return None

    def result(self) -> ServerMetrics:
        queries, hits = self._delta(PREFIX_QUERIES), self._delta(PREFIX_HITS)
        rate = hits / queries if queries and hits is not None and hits <= queries else None
        speculation = spec_decode(*(self._delta(name) for name in SPEC_DECODE))
        return ServerMetrics(
            **speculation,
            preemptions=self._delta(PREEMPTIONS),
            prefix_cache_queries=queries,
            prefix_cache_hits=hits,
            prefix_cache_hit_rate=rate,
            kv_cache_usage_peak=self._peaks.get("kv"),
            num_requests_running_peak=self._peaks.get("running"),
            num_requests_running_mean=(statistics.fmean(self._running) if self._running else None),
            num_requests_waiting_peak=self._peaks.get("waiting"),
            samples=self._samples,
            **self._cache,
        )

    def series(self) -> dict[str, Any]:
        """The /metrics time series: ``t`` (s after ``t0``) and one column per
        ``SERIES`` entry (None where the server did not report it)."""
        out: dict[str, Any] = {
            "interval_s": self.interval_s,
            "t": [round(t - self.t0, 4) for t, _ in self._series],
        }
        for column, (names, kind) in SERIES.items():
            wanted = names if isinstance(names, tuple) else (names,)
            base = next((self._before[n] for n in wanted if n in self._before), None)
            values: list[float | None] = []
            for _, sample in self._series:
                value = next((sample[n] for n in wanted if n in sample), None)
                if value is not None and kind == "counter":
                    value = value - base if base is not None else None
                values.append(value)
            out[column] = values if any(v is not None for v in values) else None
        return out

    def telemetry(
        self, detail: dict[str, Any], bounds: Sequence[float] | None = None
    ) -> dict[str, Any]:
        """The point's telemetry (``runners.telemetry``); ``detail``: the client's arrays
        (``bounds``: their window when they are a reading sample)."""
        median = statistics.median(self._scrape_s) if self._scrape_s else None
        sampler = {
            "metrics_cpu_s": round(self._cpu_s, 4),
            "metrics_interval_s": self.interval_s,
            "scrapes": self._samples,
            "scrape_ms_median": round(median * 1000, 2) if median is not None else None,
            "scrape": "filtered" if self._filtered else "full",
        }
        if self._refused:
            sampler["scrape_refused"] = self._refused
        return tm.assemble(
            self._gpu, self.t0, detail, server=self.series(), sampler=sampler, bounds=bounds
        )
