"""Where per-request samples live: compressed JSON in object storage, not in PostgreSQL.

A measurement's per-request arrays (``runners.result.Measurement.detail``: TTFT, every
token gap, latency, lengths, errors) are the bulk of it: ~45 MB of JSON for a point of
2,000 prompts x 1,024 output tokens. PostgreSQL keeps the summaries that pages filter,
sort and chart (``Measurement``'s columns and ``metrics``); the arrays go to the storage
named ``samples`` in ``settings.STORAGES`` through Django's storage API: a directory by
default (``SERVEBENCH_SAMPLES_DIR``), an S3-compatible bucket in deployment
(``SERVEBENCH_SAMPLES_STORAGE=s3``, django-storages). ``Measurement.samples`` holds the
object's name; ``portal.benchmarks.samples`` is the one reader.

Objects are named after the measurement's identity (run, backend, point, repeat), so a
retried upload writes the same object again: ingestion stays idempotent, and the object
is written *before* the row that points at it, so a row never points at nothing.

A measurement's telemetry (``runners.telemetry``: vLLM's /metrics and NVML time series,
the GPU summary) is a second object beside its samples (``telemetry_name``), written with
them, so a chart of it never reads the per-request arrays.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from typing import Any

from django.core.files.base import ContentFile
from django.core.files.storage import storages

STORAGE = "samples"
COMPRESSLEVEL = 6


def _storage() -> Any:
    return storages[STORAGE]


def describe() -> str:
    """Where the samples go, in words for a failure notice: a directory or a bucket."""
    storage = _storage()
    bucket = getattr(storage, "bucket_name", None)
    if bucket:
        endpoint = getattr(storage, "endpoint_url", None)
        return f"S3 bucket {bucket}" + (f" at {endpoint}" if endpoint else "")
    location = getattr(storage, "location", None)
    return f"directory {location}" if location else type(storage).__name__


def object_name(run_public_id: str, backend: str, point_key: str, repeat: int) -> str:
    """``samples/<run>/<digest of backend, point, repeat>.json.gz``: stable, path-safe."""
    key = json.dumps([backend, point_key, repeat], separators=(",", ":"))
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return f"samples/{run_public_id}/{digest}.json.gz"


def telemetry_name(samples_name: str) -> str:
    """The telemetry object beside the samples object ``samples_name``."""
    return samples_name.removesuffix(".json.gz") + ".telemetry.json.gz"


def encode(detail: dict[str, Any]) -> bytes:
    """The arrays as gzip-compressed compact JSON (finite numbers only: ingestion checked)."""
    raw = json.dumps(detail, separators=(",", ":"), allow_nan=False).encode()
    return gzip.compress(raw, compresslevel=COMPRESSLEVEL, mtime=0)


def save(name: str, detail: dict[str, Any]) -> int:
    """Write ``detail`` under ``name`` (replacing what a previous attempt wrote); returns
    the compressed size in bytes. Raises OSError (or the backend's error) when the
    storage is unreachable: the caller answers 5xx and the runner retries."""
    blob = encode(detail)
    storage = _storage()
    if storage.exists(name):
        storage.delete(name)
    saved = storage.save(name, ContentFile(blob))
    if saved != name:  # a backend that renamed instead of overwriting: keep ours exact
        storage.delete(saved)
        raise OSError(f"the samples storage stored {name!r} as {saved!r}")
    return len(blob)


def load(name: str) -> dict[str, Any]:
    """The arrays stored under ``name``; ``{}`` when the object is missing."""
    storage = _storage()
    try:
        with storage.open(name, "rb") as fh:
            return json.loads(gzip.decompress(fh.read()))
    except FileNotFoundError:
        return {}


def delete(name: str) -> bool:
    """Remove one object (retention: ``portal.ops.retention``); False if it was not there."""
    storage = _storage()
    if not storage.exists(name):
        return False
    storage.delete(name)
    return True


def delete_run(run_public_id: str) -> None:
    """Remove every object of one run (when the run itself is deleted)."""
    storage = _storage()
    prefix = f"samples/{run_public_id}"
    try:
        _dirs, files = storage.listdir(prefix)
    except FileNotFoundError:
        return
    for name in files:
        storage.delete(f"{prefix}/{name}")
