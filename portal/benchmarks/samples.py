"""Per-request samples: the one place that reads them.

vLLM's bench client saves every request's TTFT, token gaps and latency (the result
document's ``detail``: ``ttfts``, ``itls``, ``latencies``, ``input_lens``,
``output_lens``, ``errors``...). They are bulky (a 2,000 x 1,024 point carries ~45 MB)
and only the verdict, goodput and a run's request-level intervals read them, so every
reader goes through ``details()``. They are stored in object storage
(``portal.benchmarks.samplestore``: a directory or an S3 bucket), named by
``Measurement.samples``; rows stored before that keep them in ``Measurement.detail``, a
JSON column that list queries defer, and read the same. ``telemetry()`` reads the
time series stored beside them (``samplestore.telemetry_name``).

A point whose samples were too large to travel inline (``runners.samplesfile``) is read
as its reading sample: a uniform random subset of its requests, with ``sample_of`` (the
full count) among the arrays, so a reader that counts requests scales its count.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models.fields.json import KT, KeyTransform

from portal.benchmarks import samplestore
from portal.benchmarks.models import Measurement
from runners.samplesfile import SAMPLE_OF

# The per-request arrays a caller may ask for by name; ``itls`` is by far the largest.
KEYS = ("ttfts", "itls", "latencies", "input_lens", "output_lens", "errors", "start_times")


def details(
    measurements: Iterable[Measurement | int],
    keys: Iterable[str] | None = None,
    *,
    with_duration: bool = False,
) -> dict[int, dict[str, Any]]:
    """Measurement id -> its per-request arrays (``{}`` when it has none), in one query.

    ``measurements`` are Measurement rows or ids; ``keys`` limits the arrays read (e.g.
    without ``itls`` when no ITL is needed), ValueError naming an unknown one.
    ``with_duration`` adds the client's ``duration`` (s), which goodput divides by.
    """
    ids = sorted({m if isinstance(m, int) else m.pk for m in measurements})
    if not ids:
        return {}
    wanted = list(dict.fromkeys(keys)) if keys is not None else None
    unknown = [k for k in wanted or [] if k not in KEYS]
    if unknown:
        raise ValueError(f"keys: unknown per-request array {unknown[0]!r}; known: {KEYS}")
    rows = Measurement.objects.filter(pk__in=ids)
    fields = {f"s_{k}": KeyTransform(k, "detail") for k in wanted or []}
    if with_duration:
        fields["s_duration"] = KT("raw__duration")
    names = ["samples", *(["detail"] if wanted is None else []), *fields]
    out: dict[int, dict[str, Any]] = {}
    for pk, *values in rows.annotate(**fields).values_list("pk", *names):
        found = dict(zip(names, values, strict=True))
        stored = found.pop("samples")
        detail = dict(found.pop("detail", None) or {})
        for name, value in found.items():
            if value is not None:
                detail[name[2:]] = value
        if stored:  # in object storage (portal.benchmarks.samplestore), not in the row
            arrays = samplestore.load(stored)
            detail |= {
                k: v for k, v in arrays.items() if wanted is None or k in wanted or k == SAMPLE_OF
            }
        out[pk] = detail
    return out


def telemetry(measurements: Iterable[Measurement | int]) -> dict[int, dict[str, Any]]:
    """Measurement id -> its telemetry (``runners.telemetry``: /metrics and NVML time
    series, request times, the GPU summary); ``{}`` when it has none. One read of the
    samples storage per measurement that has samples there, and one query for those given
    by id (none for rows whose ``samples`` is loaded)."""
    names: dict[int, str] = {}
    ids: set[int] = set()
    for m in measurements:
        if isinstance(m, Measurement) and "samples" not in m.get_deferred_fields():
            names[m.pk] = m.samples
        else:
            ids.add(m if isinstance(m, int) else m.pk)
    if ids - set(names):
        rows = Measurement.objects.filter(pk__in=sorted(ids - set(names)))
        names.update(rows.values_list("pk", "samples"))
    return {
        pk: samplestore.load(samplestore.telemetry_name(name)) if name else {}
        for pk, name in sorted(names.items())
    }
