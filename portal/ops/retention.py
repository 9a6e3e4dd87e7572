"""Retention: the bulky parts of ended runs are deleted after the admin's number of days;
the aggregates stay forever.

=========  ===============================================  =================================
kind       what is deleted                                   setting (days after the run ended)
=========  ===============================================  =================================
samples    per-request arrays (``samplestore``'s objects;   SERVEBENCH_RETAIN_SAMPLES_DAYS
           ``Measurement.detail`` of rows stored before)
telemetry  the time series beside them                       SERVEBENCH_RETAIN_TELEMETRY_DAYS
logs       the local executor's work dir (runner.log,        SERVEBENCH_RETAIN_LOGS_DAYS
           server logs, result.json); Kubernetes Jobs' logs
           go with the Job (SERVEBENCH_K8S_TTL_SECONDS)
=========  ===============================================  =================================

0 keeps a kind forever (the default: nothing is deleted until an admin says so). The
same pass deletes the compare and history pages kept in Postgres
(``portal.web.pagecache``) computed more than SERVEBENCH_KEPT_PAGES_DAYS (30) ago: the
next reader computes them again. What
stays: the run, its measurements' summaries and metrics, the environment, the spec, the
verdicts' inputs that pages and history read from rows. The verdict engine falls back to
the reported summaries when per-request samples are gone (it needs them only to widen an
interval), so compares and gates keep working.

Each kind's deletion is recorded on the run (``Run.samples_expired_at`` ...), so pages say
"per-request samples expired on DATE (retention N days)" instead of showing nothing, and
a pass never looks at a run twice. ``purge`` is idempotent and safe to run twice at once
(a second pass deletes what is already gone; the marks are conditional updates). The
daily beat task ``servebench.retention`` calls it (``portal.ops.tasks``).

``usage()`` is what the staff storage page shows: bytes and counts per kind.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.files.storage import storages
from django.db import connection
from django.db.models import Count, Q, Sum
from django.utils import timezone

from portal.benchmarks import samplestore
from portal.benchmarks.models import FINAL_STATUSES, Measurement, Run
from portal.web import pagecache

log = logging.getLogger(__name__)

KINDS = ("samples", "telemetry", "logs")
BATCH = 200
_SETTINGS = {
    "samples": "SERVEBENCH_RETAIN_SAMPLES_DAYS",
    "telemetry": "SERVEBENCH_RETAIN_TELEMETRY_DAYS",
    "logs": "SERVEBENCH_RETAIN_LOGS_DAYS",
}
WORDS = {"samples": "per-request samples", "telemetry": "telemetry", "logs": "runner logs"}


def days(kind: str) -> int:
    """The retention of ``kind`` in days; 0 = forever."""
    return int(getattr(settings, _SETTINGS[kind]))


@dataclass
class RetentionReport:
    """Public ids of the runs whose parts were deleted, per kind, and what failed."""

    samples: list[str] = field(default_factory=list)
    telemetry: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pages: int = 0  # kept compare and history pages deleted (SERVEBENCH_KEPT_PAGES_DAYS)


def _purge_samples(run: Run) -> None:
    rows = Measurement.objects.filter(run=run)
    for name in rows.exclude(samples="").values_list("samples", flat=True):
        samplestore.delete(name)
        samplestore.delete(samplestore.full_name(name))  # a large point's full arrays
    rows.exclude(detail={}).update(detail={})


def _purge_telemetry(run: Run) -> None:
    for name in (
        Measurement.objects.filter(run=run).exclude(samples="").values_list("samples", flat=True)
    ):
        samplestore.delete(samplestore.telemetry_name(name))


def _purge_logs(run: Run) -> None:
    """The local executor's work dir, if it lies where the executor keeps them."""
    handle = run.executor_handle if isinstance(run.executor_handle, dict) else {}
    workdir = handle.get("workdir") if run.executor == "local" else None
    if not workdir:
        return
    root = (Path(settings.SERVEBENCH_DATA_DIR) / "runs").resolve()
    path = Path(workdir).resolve()
    if path.parent != root or path.name != run.public_id:
        raise ValueError(f"refusing to delete {workdir!r}: not a run's work dir under {root}")
    if path.is_dir():
        shutil.rmtree(path)


_PURGE = {"samples": _purge_samples, "telemetry": _purge_telemetry, "logs": _purge_logs}


def purge(now: datetime | None = None, batch: int = BATCH) -> RetentionReport:
    """Delete every kind's expired parts of ended runs and mark the runs."""
    now = now or timezone.now()
    report = RetentionReport()
    for kind in KINDS:
        keep = days(kind)
        if not keep:
            continue
        mark = f"{kind}_expired_at"
        due = Run.objects.filter(
            status__in=FINAL_STATUSES,
            finished_at__lt=now - timedelta(days=keep),
            holds_slot=False,  # a runner that is still stopping may still write its log
            **{f"{mark}__isnull": True},
        ).only("pk", "public_id", "executor", "executor_handle")
        last = 0
        while True:
            runs = list(due.filter(pk__gt=last).order_by("pk")[:batch])
            for run in runs:
                last = run.pk
                try:
                    _PURGE[kind](run)
                except Exception as exc:  # storage errors of any backend: next time
                    log.warning("retention: %s of run %s: %r", kind, run.short_id, exc)
                    report.errors.append(f"{kind} {run.public_id}: {exc}")
                    continue
                if Run.objects.filter(pk=run.pk, **{f"{mark}__isnull": True}).update(
                    **{mark: now, "updated_at": now}
                ):
                    getattr(report, kind).append(run.public_id)
            if len(runs) < batch:
                break
    report.pages = pagecache.prune(now - timedelta(days=settings.SERVEBENCH_KEPT_PAGES_DAYS))
    if report.samples or report.telemetry or report.logs or report.errors or report.pages:
        log.info(
            "retention: samples of %d runs, telemetry of %d, logs of %d deleted; %d errors; "
            "%d kept pages deleted",
            len(report.samples),
            len(report.telemetry),
            len(report.logs),
            len(report.errors),
            report.pages,
        )
    return report


def notes(run: Run) -> list[str]:
    """What a run page says about its expired parts, e.g. "Per-request samples expired on
    2026-12-01 (retention 30 days)."."""
    out = []
    for kind in KINDS:
        when = getattr(run, f"{kind}_expired_at", None)
        if when is None:
            continue
        keep = days(kind)
        policy = f" (retention {keep} day{'s' if keep != 1 else ''})" if keep else ""
        word = WORDS[kind]
        out.append(f"{word[0].upper()}{word[1:]} expired on {when:%Y-%m-%d}{policy}.")
    return out


# --------------------------------------------------------------------------- usage


def _walk(root: Path) -> dict[str, tuple[int, int]]:
    """{"samples"|"telemetry": (files, bytes)} under a samples directory."""
    out = {"samples": [0, 0], "telemetry": [0, 0]}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            kind = "telemetry" if name.endswith(".telemetry.json.gz") else "samples"
            try:
                size = os.stat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            out[kind][0] += 1
            out[kind][1] += size
    return {k: (v[0], v[1]) for k, v in out.items()}


def _dir_bytes(root: Path) -> tuple[int, int]:
    """(run work dirs, bytes) under the local executor's runs directory."""
    count = size = 0
    if not root.is_dir():
        return 0, 0
    for entry in os.scandir(root):
        if entry.is_dir(follow_symlinks=False):
            count += 1
            for dirpath, _dirs, files in os.walk(entry.path):
                for name in files:
                    try:
                        size += os.lstat(os.path.join(dirpath, name)).st_size
                    except OSError:
                        continue
    return count, size


def usage() -> dict[str, Any]:
    """Bytes and counts per kind: from the database (always), from the samples directory
    and the local executor's work dirs (when on this machine's disk)."""
    measurements = Measurement.objects.aggregate(
        stored=Count("id", filter=~Q(samples="")),
        stored_bytes=Sum("samples_bytes"),
        expired=Count("id", filter=~Q(samples="") & Q(run__samples_expired_at__isnull=False)),
    )
    runs = Run.objects.aggregate(
        total=Count("id"),
        samples=Count("id", filter=Q(samples_expired_at__isnull=False)),
        telemetry=Count("id", filter=Q(telemetry_expired_at__isnull=False)),
        logs=Count("id", filter=Q(logs_expired_at__isnull=False)),
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(pg_column_size(detail)), 0) FROM benchmarks_measurement "
            "WHERE detail <> '{}'::jsonb"
        )
        (legacy_bytes,) = cursor.fetchone()
        cursor.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = current_schema() "
            "AND c.relname LIKE ANY (%s) ORDER BY 2 DESC",
            [["benchmarks_%", "alerts_%", "schedules_%"]],
        )
        tables = cursor.fetchall()
    out: dict[str, Any] = {
        "retention": {kind: days(kind) for kind in KINDS},
        "measurements_with_samples": measurements["stored"],
        "samples_and_telemetry_bytes": measurements["stored_bytes"] or 0,
        "measurements_with_expired_samples": measurements["expired"],
        "samples_in_database_bytes": int(legacy_bytes),
        "runs": runs["total"],
        "runs_expired": {kind: runs[kind] for kind in KINDS},
        "tables": [{"table": name, "bytes": int(size)} for name, size in tables],
        "storage": settings.SERVEBENCH_SAMPLES_STORAGE,
        "files": None,
        "logs": None,
    }
    if settings.SERVEBENCH_SAMPLES_STORAGE == "filesystem":
        location = Path(storages[samplestore.STORAGE].location)
        found = _walk(location / "samples") if location.is_dir() else {}
        out["files"] = {k: {"count": c, "bytes": b} for k, (c, b) in found.items()}
    if settings.SERVEBENCH_EXECUTOR == "local":
        count, size = _dir_bytes(Path(settings.SERVEBENCH_DATA_DIR) / "runs")
        out["logs"] = {"count": count, "bytes": size}
    return out
