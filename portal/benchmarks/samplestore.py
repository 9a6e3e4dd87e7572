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

A point too large to travel inside its measurement (``runners.samplesfile``) has its full
arrays uploaded as a stream (``save_stream``) under ``full_name``, before the measurement;
the measurement carries a reading sample of them, stored under the usual name, which is
what every reader reads.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import tempfile
import zlib
from typing import Any

from django.core.files.base import ContentFile, File
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


def full_name(samples_name: str) -> str:
    """The full arrays' object beside the reading sample ``samples_name`` (a measurement
    whose samples were uploaded as a stream: ``runners.samplesfile``)."""
    return samples_name.removesuffix(".json.gz") + ".full.json.gz"


class UploadRefused(ValueError):
    """An uploaded samples stream that is not what it claims (HTTP 400/413 naming why)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


CHUNK = 1 << 20


def save_stream(name: str, stream: Any, length: int, sha256: str, inflated_limit: int) -> int:
    """Write the gzip-compressed JSON ``stream`` (``length`` bytes: a request body, read
    a chunk at a time) under ``name`` as it is, without holding it in memory: it is
    spooled to a temporary file while its SHA-256 is checked against ``sha256`` and it is
    inflated chunk by chunk to check it is whole gzip of a JSON object no larger than
    ``inflated_limit`` bytes; then stored (replacing a previous attempt's). Returns the
    size. UploadRefused when it is not; OSError (or the backend's) when the storage fails."""
    digest = hashlib.sha256()
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    inflated = 0
    first = last = b""
    received = 0
    with tempfile.TemporaryFile(prefix="servebench-samples-") as spool:
        while received < length:
            chunk = stream.read(min(CHUNK, length - received))
            if not chunk:
                break
            received += len(chunk)
            digest.update(chunk)
            spool.write(chunk)
            data = chunk
            while data:
                try:
                    out = inflater.decompress(data, CHUNK)
                except zlib.error as exc:
                    raise UploadRefused(f"body: not valid gzip ({exc})") from None
                inflated += len(out)
                if inflated > inflated_limit:
                    raise UploadRefused(
                        f"body: the samples inflate to more than {inflated_limit:,} bytes "
                        "(SERVEBENCH_MAX_SAMPLES_BYTES); measure fewer prompts per point or "
                        "ask an admin to raise the limit",
                        413,
                    )
                if out:
                    first = first or out[:1]
                    last = out[-1:]
                data = inflater.unconsumed_tail
                if inflater.eof:
                    break
        if received != length:
            raise UploadRefused(f"body: {received} of the {length} bytes announced arrived")
        if not inflater.eof or inflater.unused_data:
            raise UploadRefused("body: the gzip stream is truncated or has trailing data")
        if digest.hexdigest() != sha256:
            raise UploadRefused("X-Content-SHA256: the body's SHA-256 differs; send it again")
        if first.strip() != b"{" or last.strip() != b"}":
            raise UploadRefused("body: the samples are not a JSON object of arrays")
        spool.seek(0)
        storage = _storage()
        if storage.exists(name):
            storage.delete(name)
        saved = storage.save(name, File(spool))
        if saved != name:
            storage.delete(saved)
            raise OSError(f"the samples storage stored {name!r} as {saved!r}")
    return received


def size(name: str) -> int | None:
    """The stored size of ``name`` in bytes; None when it is not there."""
    storage = _storage()
    try:
        return int(storage.size(name)) if storage.exists(name) else None
    except FileNotFoundError:
        return None


def open_stream(name: str) -> Any:
    """``name`` opened for reading in binary (a download streams from it)."""
    return _storage().open(name, "rb")


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
