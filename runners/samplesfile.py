"""A measurement's per-request samples as a file of their own, for points too large to
travel inside the measurement.

vLLM's ``--save-detailed`` arrays (``runners.result.Measurement.detail``) grow with the
requests and, for the token gaps (``itls``), with every output token: 2,000 prompts x
1,024 tokens is ~2 million numbers, ~45 MB of JSON. A measurement carries them inline up
to ``inline_values()`` numbers. Past that the runner (``runners.report``):

1. writes the full arrays to a gzip-compressed JSON file, key by key and a slice of
   requests at a time (``write``), so no JSON text of the whole exists in memory;
2. uploads that file to the portal as a stream (``PUT .../samples``), which the portal
   writes to its samples storage chunk by chunk, checking the gzip as it goes;
3. posts the measurement with a *reading sample* in ``detail`` (``reading_sample``: a
   uniform random subset of the requests, every array kept aligned, seeded by the
   measurement's identity) and ``samples_full`` naming the upload (requests, bytes,
   SHA-256).

The client's own metrics (throughput, percentiles, goodput) always come from every
request; pages read the reading sample only where they recompute from samples (a
verdict's request-level interval, goodput for another SLO, scaled by ``sample_of``, a run
page's request-level intervals). The full file is downloadable from the run's API
(``GET /api/v1/runs/{id}/samples``). ``bench/samples_upload.py`` measures the memory
either way takes.

The file's format is the portal's samples object (``portal.benchmarks.samplestore``):
compact JSON of the arrays, gzip-compressed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

INLINE_VALUES_ENV = "SERVEBENCH_SAMPLES_INLINE_VALUES"
# ~45 MB of JSON (2,000 prompts x 1,024 output tokens): well under the portal's default
# measurement limit (SERVEBENCH_MAX_MEASUREMENT_BYTES, 256 MB inflated).
INLINE_VALUES = 2_000_000
SLICE = 4096  # requests encoded at a time
SAMPLE_OF = "sample_of"  # the reading sample's key: how many requests the full set has


def inline_values() -> int:
    """The most numbers a measurement carries inline (``SERVEBENCH_SAMPLES_INLINE_VALUES``
    overrides)."""
    raw = os.environ.get(INLINE_VALUES_ENV, "").strip()
    try:
        return max(int(raw), 1) if raw else INLINE_VALUES
    except ValueError:
        return INLINE_VALUES


def requests_in(detail: Mapping[str, Any]) -> int:
    """How many requests the arrays describe (the longest array)."""
    return max((len(v) for v in detail.values() if isinstance(v, list)), default=0)


def values_in(detail: Mapping[str, Any]) -> int:
    """How many numbers (and error strings) the arrays hold: one per request per array,
    and one per token gap."""
    total = 0
    for value in detail.values():
        if not isinstance(value, list):
            continue
        total += len(value)
        if value and isinstance(value[0], list):
            total += sum(len(v) for v in value if isinstance(v, list))
    return total


def _array(value: Any) -> bool:
    """A per-request array: a list, or a sequence read a slice at a time
    (``runners.spilled.GapLists``)."""
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


def write(detail: Mapping[str, Any], out: IO[bytes]) -> None:
    """``detail`` as gzip-compressed compact JSON into ``out`` (a binary file), one slice
    of requests at a time: what ``json.loads(gzip.decompress(...))`` reads back equals
    ``detail`` (a sequence read as a list). Non-finite numbers raise ValueError (JSON has
    none)."""
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6, mtime=0) as gz:
        gz.write(b"{")
        for n, (key, value) in enumerate(detail.items()):
            gz.write((("," if n else "") + json.dumps(str(key)) + ":").encode())
            if not _array(value):
                gz.write(_dumps(value))
                continue
            gz.write(b"[")
            for start in range(0, len(value), SLICE):
                part = _dumps(list(value[start : start + SLICE]))[1:-1]
                if start and part:
                    gz.write(b",")
                gz.write(part)
            gz.write(b"]")
        gz.write(b"}")


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def write_file(detail: Mapping[str, Any], path: Path) -> tuple[int, str]:
    """``write`` into ``path``; returns its size in bytes and its SHA-256 (hex)."""
    with open(path, "wb") as out:
        hashed = _Hashing(out)
        write(detail, hashed)
    return hashed.size, hashed.digest.hexdigest()


class _Hashing:
    """A binary file that hashes and counts what is written to it (no second read)."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.digest, self.size = out, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()


def chosen_requests(n: int, values: int, limit: int, seed: str) -> list[int]:
    """Which of ``n`` requests (holding ``values`` numbers) a reading sample of about
    ``limit`` numbers keeps: uniformly at random, seeded, in their order."""
    keep = n if values <= limit else max(1, min(n, n * limit // max(values, 1)))
    return sorted(random.Random(seed).sample(range(n), keep))  # noqa: S311 - sampling


def reading_sample(detail: Mapping[str, Any], limit: int, seed: str) -> tuple[dict[str, Any], int]:
    """A uniform random subset of the requests whose arrays hold about ``limit``
    numbers, every per-request array cut at the same requests (in their order), with
    ``sample_of`` (the full count); and how many requests it kept. The generator is
    seeded with ``seed`` (the measurement's identity), so a retry picks the same ones."""
    n = requests_in(detail)
    chosen = chosen_requests(n, values_in(detail), limit, seed)
    keep = len(chosen)
    out: dict[str, Any] = {}
    for key, value in detail.items():
        if isinstance(value, list) and len(value) == n:
            out[key] = [value[i] for i in chosen]
        elif not isinstance(value, list):
            out[key] = value
    out[SAMPLE_OF] = n
    return out, keep
