"""The result document and the runner -> portal messages.

One JSON document per run (``schema_version`` 1):

    {
      "schema_version": 1,
      "runner_version": "0.1.0",
      "status": "succeeded" | "failed" | "partial",
      "spec": {...},                 # the spec as executed (defaults filled in)
      "environment": {...},          # runners.environment.capture()
      "fingerprint": "sha256 hex",   # runners.fingerprint.fingerprint()
      "measurements": [Measurement, ...],
      "errors": [{"where": "...", "message": "..."}],
      "timings": {"started_at": iso, "finished_at": iso, "duration_s": float, ...},
      "sla_searches": [...]          # runners.sla.summarize(): answer, text, path per backend
      "config_search": [...]         # runners.configsearch.outcomes(): state, reason per config
      "ranking": {...} | null        # the portal's (portal.benchmarks.ranking); not the runner's
    }

``backend_kind`` is ``hf-sequential``, ``hf-static-cache`` or ``hf-batched`` (the HF
baselines, ``runners.hf`` and ``runners.hf_baselines``), ``vllm`` (a server the runner
started), ``transformers-serve`` (Transformers' server the runner started,
``runners.transformers_server``) or ``endpoint`` (a deployed server,
``runners.endpoint``). A served measurement's ``raw["servebench"]`` says how its requests
were made (API, fields dropped, whether output lengths were forced:
``runners.vllm_bench.request_facts``).

A Measurement is identified inside its run by (backend, point key, repeat): that is the
idempotency key of the portal's ingestion endpoint.

Metric names follow vLLM's bench client (``output_throughput``, ``p99_ttft_ms`` ...) so
numbers compare with the community's; the HF baseline reports the same keys. Where the
run's GPUs could be read through NVML, ``ENERGY_KEYS`` are added (``runners.telemetry``:
J per output token, mean power, GPU utilisation, and cost per million output tokens when
the spec names a GPU-hour price).

Numbers are what they measure: finite, and never negative where a negative is
meaningless (counts, bytes, durations, rates, latencies, metrics). The portal validates
every runner message with these models, so a report that says otherwise is refused
naming its field.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

RESULT_SCHEMA_VERSION = 1

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 99)

# The canonical metric keys every measurement may carry (absent = not defined).
THROUGHPUT_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
)
LATENCY_KEYS = tuple(
    f"{stat}_{m}_ms"
    for m in LATENCY_METRICS
    for stat in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES))
)
METRIC_KEYS = THROUGHPUT_KEYS + LATENCY_KEYS
# Derived from the measurement's telemetry (runners.telemetry.DERIVED_KEYS); absent when
# not measured (no NVML) or, for cost, without a price.
ENERGY_KEYS = (
    "energy_per_output_token_j",
    "avg_power_w",
    "gpu_util",
    "cost_per_million_output_tokens",
)


# A measured quantity: finite and not negative (a count, bytes, seconds, a rate).
Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
_FINGERPRINT = re.compile(r"\A[0-9a-f]{0,64}\Z")


def utcnow() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class PointInfo(BaseModel):
    """The resolved workload of a measurement (see runners.spec.Point)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    key: str = Field(description="'<sweep>:<axis>=<value>' or 'baseline' / 'single'.")
    sweep: str
    axis: str | None = None
    value: float | None = None
    input_len: Count
    output_len: Count
    max_concurrency: Count
    num_prompts: Count
    request_rate: Amount | None = None


class FullSamples(BaseModel):
    """The full per-request arrays of a measurement that carries a reading sample of
    them (``runners.samplesfile``): uploaded to the portal before the measurement."""

    model_config = ConfigDict(extra="forbid")

    requests: Count = Field(description="Requests in the full arrays.")
    kept: Count = Field(description="Requests in the reading sample ('detail').")
    bytes: Count = Field(description="Size of the uploaded gzip-compressed JSON.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the upload.")


class ServerMetrics(BaseModel):
    """Deltas and peaks read from the vLLM server's /metrics around one point."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    preemptions: Amount | None = None
    prefix_cache_queries: Amount | None = None
    prefix_cache_hits: Amount | None = None
    prefix_cache_hit_rate: Fraction | None = None
    kv_cache_usage_peak: Fraction | None = Field(
        None, description="0..1, sampled during the point."
    )
    num_requests_running_peak: Amount | None = None
    num_requests_running_mean: Amount | None = Field(
        None,
        description=(
            "Mean of vllm:num_requests_running over the samples taken while any request "
            "ran: the batch decode actually had (the roofline's batch)."
        ),
    )
    num_requests_waiting_peak: Amount | None = None
    samples: Count = 0
    # Speculative decoding over the point (runners.server_metrics.spec_decode); absent
    # when the server does not speculate.
    spec_decode_drafts: Amount | None = None
    spec_decode_draft_tokens: Amount | None = None
    spec_decode_accepted_tokens: Amount | None = None
    spec_decode_acceptance_rate: Fraction | None = None
    spec_decode_mean_accepted_length: Amount | None = None
    # The KV cache vLLM allocated (vllm:cache_config_info): capacity = blocks x block_size.
    num_gpu_blocks: Amount | None = None
    block_size: Amount | None = None
    kv_cache_memory_bytes: Amount | None = None
    cache_dtype: str | None = None
    gpu_memory_utilization: Fraction | None = None


class Measurement(BaseModel):
    """One backend at one sweep point, one repeat."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    backend: str = Field(description="Backend name from the spec.")
    backend_kind: Literal[
        "hf-sequential", "hf-static-cache", "hf-batched", "vllm", "endpoint", "transformers-serve"
    ]
    point: PointInfo
    repeat: int = Field(ge=0)
    status: Literal["succeeded", "failed"]
    error: str | None = Field(None, description="Why it failed, readable by a person.")
    metrics: dict[str, Amount] = Field(
        default_factory=dict,
        description="METRIC_KEYS and ENERGY_KEYS subset: finite, never negative.",
    )
    server_metrics: ServerMetrics | None = None
    gpu_memory_peak_bytes: Count | None = None
    commands: dict[str, str] = Field(
        default_factory=dict, description="'serve', 'bench' or 'hf': shell-quoted commands."
    )
    raw: dict[str, Any] = Field(
        default_factory=dict, description="The client's JSON without per-request arrays."
    )
    detail: dict[str, Any] = Field(
        default_factory=dict,
        description="Per-request arrays: input_lens, output_lens, ttfts, itls, latencies, errors.",
    )
    samples_full: FullSamples | None = Field(
        None,
        description=(
            "Set when the per-request arrays were too large to travel inline "
            "(runners.samplesfile): 'detail' is then a reading sample of them and the full "
            "arrays were uploaded before this measurement (PUT .../samples)."
        ),
    )
    conditions: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "How it was measured (runners.conditions): cores owned, threads, CPU time against "
            "wall time, other processes' CPU on its cores, steal, quota throttling, host load; "
            "'contended' with plain 'reasons' when something competed for its cores. Empty in "
            "documents written before it existed."
        ),
    )
    telemetry: dict[str, Any] = Field(
        default_factory=dict,
        description=(
            "What the hardware did (runners.telemetry): vLLM's /metrics and NVML time series "
            "on the client's clock, the GPU summary over the requests' window, and what "
            "sampling cost. Empty in documents written before it existed."
        ),
    )
    started_at: str
    finished_at: str
    duration_s: Amount

    # Where this runner wrote the full arrays of a measurement whose ``detail`` is a
    # reading sample (``runners.spilled``): uploaded by ``runners.report``, never sent.
    _samples_file: Path | None = PrivateAttr(default=None)

    @property
    def samples_file(self) -> Path | None:
        """The full arrays' file on this machine (``samples_full``), if this runner wrote it."""
        return self._samples_file

    def keep_samples_file(self, path: Path) -> None:
        self._samples_file = path

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.backend, self.point.key, self.repeat)


EventType = Literal["started", "environment", "progress", "finished", "failed"]


class Event(BaseModel):
    """A lifecycle message from the runner to the portal.

    - started:     {total: measurements expected}
    - environment: {environment: {...}, fingerprint: str}
    - progress:    {done, total, message}
    - finished:    {status: succeeded|partial, errors, timings}
    - failed:      {message: why, errors, timings}
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: EventType
    at: str = Field(default_factory=utcnow)
    message: str | None = None
    done: Count | None = None
    total: Count | None = None
    status: Literal["succeeded", "failed", "partial"] | None = None
    environment: dict[str, Any] | None = None
    fingerprint: str | None = None
    errors: list[dict[str, str]] | None = None
    timings: dict[str, Any] | None = None

    @field_validator("fingerprint")
    @classmethod
    def _fingerprint(cls, v: str | None) -> str | None:
        if v is not None and not _FINGERPRINT.match(v):
            raise ValueError("a fingerprint is up to 64 lowercase hex digits")
        return v


class ResultDocument(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = RESULT_SCHEMA_VERSION
    runner_version: str
    status: Literal["succeeded", "failed", "partial", "running"]
    spec: dict[str, Any]
    environment: dict[str, Any] = Field(default_factory=dict)
    fingerprint: str | None = None
    measurements: list[Measurement] = Field(default_factory=list)
    errors: list[dict[str, str]] = Field(default_factory=list)
    timings: dict[str, Any] = Field(default_factory=dict)
    sla_searches: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The spec's SLA search on each backend (runners.sla.summarize).",
    )
    config_search: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Each configuration of a configuration search: measured, dropped or not "
        "measured, and why (runners.configsearch.outcomes).",
    )
    ranking: dict[str, Any] | None = Field(
        None,
        description="The portal's ranking of the run's served configurations "
        "(portal.benchmarks.ranking); the runner leaves it empty.",
    )
