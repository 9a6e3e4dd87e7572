"""A runner's reports about its run (docs/protocol.md): checked against the run's spec,
then stored. The portal stores only what the spec has; what does not fit is refused with
the field that does not, so a runner (and whoever reads its log) learns why.

- ``ingest_event(run, event)``: started, environment, progress, finished, failed; returns
  the run's status afterwards. A run's end goes through ``lifecycle.transition``.
- ``ingest_measurement(run, measurement)``: one measurement, once (idempotent on backend,
  point and repeat), keeping the run's best output tok/s (the runs list's column); its
  per-request samples go to the samples storage first.
- ``check_event`` / ``check_measurement``: what fits the run (caps on runner text, the
  spec's backends, points, repeats, and an SLA search's points).
- ``expected_measurements`` / ``sla_searches``: an SLA search's progress and answers, read
  from the stored measurements (``runners.sla``).
- ``IngestRefused`` (API: 400 naming the field), ``StorageUnavailable`` (503: retry),
  ``lifecycle.RunFinished`` (409: the run has ended, stop).

A runner's ``finished`` with status ``partial`` (some points failed) makes the run
**failed**, with a reason that lists the failed points; the successful measurements stay
and show. A CI gate must not pass on a half-measured run.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Now
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from portal.benchmarks import energy, samplestore
from portal.benchmarks.environment import store_environment
from portal.benchmarks.lifecycle import RunFinished, enqueue_dispatch, transition
from portal.benchmarks.models import FINAL_STATUSES, Measurement, Run, RunStatus
from portal.benchmarks.queries import refresh_best_throughput
from portal.benchmarks.sharing import scrub, scrub_value
from runners import causes, sla
from runners import configsearch as cs
from runners import result as rr
from runners import spec as rs

log = logging.getLogger(__name__)


class StorageUnavailable(Exception):
    """The samples storage failed; the runner is told to retry (HTTP 503)."""


class IngestRefused(ValueError):
    """A runner report that does not fit the run (HTTP 400 naming ``field``): a point,
    backend or repeat the spec does not have, a name that would not fit its column, a bad
    date or number. The message tells the runner (and whoever reads its log) why."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


# Caps on runner text: error texts keep their head and their end (a log tail's last
# lines say most); identities (names, keys) that would not fit are refused instead.
MAX_ERROR_CHARS = 8_000
MAX_COMMAND_CHARS = 16_000
MAX_RUNNER_ERRORS = 50
MAX_METRICS = 200
MAX_PROGRESS = 2**31 - 1
_FINGERPRINT = re.compile(r"^[0-9a-f]{0,64}\Z")
_COMMAND_KINDS = ("serve", "bench", "hf")


def cap_text(text: str | None, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, keeping its first quarter and its end."""
    if not text or len(text) <= limit:
        return text or ""
    head = limit // 4
    tail = limit - head - 40
    return f"{text[:head]}\n[... {len(text) - head - tail} characters cut ...]\n{text[-tail:]}"


def _when(value: str | None, field: str = "at") -> datetime:
    """A runner's ISO 8601 time; now when absent; IngestRefused when it is not a real
    date or lies outside 2000-2200."""
    try:
        parsed = parse_datetime(value) if value else None
    except ValueError:  # well-formed but impossible: month 13, Feb 30, hour 25
        raise IngestRefused(field, f"{value[:40]!r} is not a valid date and time") from None
    if value and parsed is None:
        raise IngestRefused(field, f"{value[:40]!r} is not an ISO 8601 date and time")
    if parsed is None:
        return timezone.now()
    if not 2000 <= parsed.year <= 2200:
        raise IngestRefused(field, f"{value[:40]!r} is not a plausible time (2000-2200)")
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, UTC)


def check_event(run: Run, event: rr.Event) -> rr.Event:
    """The event with its text capped and scrubbed of credentials (its message and errors:
    ``sharing.scrub_value``; its environment is scrubbed where it is stored,
    ``environment.store_environment``), or IngestRefused when a field does not fit (see
    ``IngestRefused``)."""
    _when(event.at, "at")
    for field in ("done", "total"):
        value = getattr(event, field)
        if value is not None and not 0 <= value <= MAX_PROGRESS:
            raise IngestRefused(field, f"{field} must be between 0 and {MAX_PROGRESS}")
    if event.fingerprint is not None and not _FINGERPRINT.match(event.fingerprint):
        raise IngestRefused("fingerprint", "a fingerprint is up to 64 lowercase hex digits")
    errors = event.errors or []
    if len(errors) > MAX_RUNNER_ERRORS:
        raise IngestRefused("errors", f"at most {MAX_RUNNER_ERRORS} errors per event")
    update: dict[str, Any] = {
        "message": scrub_value(cap_text(event.message)) if event.message is not None else None,
        "errors": [{k: scrub_value(cap_text(v, 2_000)) for k, v in e.items()} for e in errors]
        or None,
    }
    return event.model_copy(update=update)


def check_identity(
    run: Run, backend_name: str, point_key: str, repeat: int, kind: str | None = None
) -> tuple[Any, rs.Point]:
    """The backend and point of the run's spec that (backend, point key, repeat) name, or
    IngestRefused: they must be ones the spec has (an SLA search's loads included), the
    backend of ``kind`` when given, and fit their columns."""
    spec = rs.parse_spec(run.spec, stored=True)
    backend = next((b for b in spec.backends if b.name == backend_name), None)
    if backend is None:
        names = ", ".join(b.name for b in spec.backends)
        raise IngestRefused(
            "backend", f"the run's spec has no backend {backend_name[:64]!r} ({names})"
        )
    if kind is not None and backend.kind != kind:
        raise IngestRefused(
            "backend_kind", f"backend {backend.name!r} is {backend.kind!r}, not {kind!r}"
        )
    if isinstance(backend, rs.HFBackend):
        points = {"baseline": rs.hf_point(spec, backend)}
    else:
        points = {p.key: p for p in spec.points()}
    point = points.get(point_key)
    if point is not None and not 0 <= repeat < spec.repeats:
        raise IngestRefused(
            "repeat", f"the run's spec has repeats 0..{spec.repeats - 1}, not {repeat}"
        )
    point = point or _search_point(run, spec, backend, point_key, repeat)
    if point is None:
        known = ", ".join(list(points)[:8])
        raise IngestRefused(
            "point.key",
            f"the run's spec has no point {point_key[:128]!r} for backend {backend.name!r} "
            f"({known}{', ...' if len(points) > 8 else ''})",
        )
    if len(point.key) > 128 or len(backend.name) > 64:
        raise IngestRefused("point.key", "the point key is longer than 128 characters")
    return backend, point


def check_measurement(run: Run, m: rr.Measurement) -> rr.Measurement:
    """The measurement as the run's spec says it is, or IngestRefused: its backend,
    point and repeat must be ones the spec has (the point's workload is taken from the
    spec, not the runner), names must fit their columns, text is capped."""
    _backend, point = check_identity(run, m.backend, m.point.key, m.repeat, m.backend_kind)
    if len(m.metrics) > MAX_METRICS or any(len(k) > 64 for k in m.metrics):
        raise IngestRefused("metrics", f"at most {MAX_METRICS} metrics, names of 64 characters")
    for kind, command in m.commands.items():
        if kind not in _COMMAND_KINDS or len(command) > MAX_COMMAND_CHARS:
            raise IngestRefused(
                f"commands.{kind[:20]}",
                f"commands are {', '.join(_COMMAND_KINDS)}, each at most "
                f"{MAX_COMMAND_CHARS} characters",
            )
    if m.duration_s < 0:
        raise IngestRefused("duration_s", "duration_s must not be negative")
    _when(m.started_at, "started_at")
    _when(m.finished_at, "finished_at")
    info = rr.PointInfo(key=point.key, **point.model_dump())
    return m.model_copy(
        update={
            "point": info,
            # Runner text, scrubbed of credentials once, here (pages read it as stored).
            "error": scrub_value(cap_text(m.error)) or None,
            "conditions": scrub_value(m.conditions),
            "commands": scrub_value(m.commands),
            "raw": scrub_value(m.raw),
        }
    )


def _search_point(
    run: Run, spec: rs.Spec, backend: Any, point_key: str, repeat: int
) -> rs.Point | None:
    """The SLA search point a measurement claims to be (``runners.sla``): a load within
    the search's range, on a searched backend, within its point budget; repeat 0, or 1
    for a load measured again after it missed the SLO at 0 (``confirm``; which misses
    the runner confirms is its call: a runner may hold the spec as it was before
    ``confirm`` existed)."""
    search = spec.sla_search
    value = sla.search_value(spec, point_key)
    if search is None or value is None or backend not in spec.search_backends:
        return None
    if repeat not in (0, 1):
        raise IngestRefused(
            "repeat",
            f"an SLA search measures a load at repeat 0, and a load that missed the SLO once "
            f"more at repeat 1 (its confirm), not at {repeat}",
        )
    if repeat == 1:
        first = (
            Measurement.objects.filter(run=run, backend=backend.name, point_key=point_key, repeat=0)
            .values_list("status", "metrics")
            .first()
        )
        if first is None or sla.judge(search, first[0], first[1] or {})[0]:
            raise IngestRefused(
                "repeat",
                "an SLA search measures a load again (repeat 1) only after it missed the "
                "SLO at repeat 0",
            )
    used = (
        Measurement.objects.filter(run=run, backend=backend.name, sweep=search.name)
        .exclude(point_key=point_key, repeat=repeat)
        .count()
    )
    if used >= search.max_points:
        raise IngestRefused(
            "point.key",
            f"the SLA search on {backend.name!r} has measured its {search.max_points} points",
        )
    return rs.search_point(spec, value)


def _search_rows(run: Run) -> list[dict[str, Any]]:
    """The run's measurements as ``runners.sla`` reads them (one light query)."""
    rows = Measurement.objects.filter(run=run).order_by("id")
    return [
        {
            "backend": backend,
            "point": {"key": key},
            "repeat": repeat,
            "status": status,
            "metrics": metrics,
        }
        for backend, key, repeat, status, metrics in rows.values_list(
            "backend", "point_key", "repeat", "status", "metrics"
        )
    ]


def expected_measurements(
    run: Run, spec: rs.Spec | None = None, timings: dict[str, Any] | None = None
) -> int:
    """How many measurements the run has when complete: the spec's, less the points an
    SLA search that finished early did not need (``runners.sla.expected_measurements``)
    and those of the configurations its budget did not start (``runners.configsearch``,
    read from ``timings``, by default the run's)."""
    spec = spec or rs.parse_spec(run.spec, stored=True)
    skipped = [
        n
        for n in cs.skipped_of(run.timings if timings is None else timings)
        if n in spec.config_names
    ]
    less = sum(cs.planned_measurements(spec, n) for n in skipped)
    if spec.sla_search is None:
        if skipped:
            return spec.total_measurements() - less
        return run.progress_total or spec.total_measurements()
    return sla.expected_measurements(spec, _search_rows(run)) - less


def sla_searches(run: Run, spec: rs.Spec | None = None) -> list[dict[str, Any]]:
    """The run's SLA search answers and paths (``runners.sla.summarize``); a search an
    ended run left unfinished is ``stopped``."""
    spec = spec or rs.parse_spec(run.spec, stored=True)
    if spec.sla_search is None:
        return []
    return sla.summarize(spec, _search_rows(run), ended=run.status in FINAL_STATUSES)


def config_outcomes(
    run: Run, spec: rs.Spec | None = None, searches: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Each configuration of the run's configuration search: measured, dropped or not
    measured, and why (``runners.configsearch.outcomes``); empty without one."""
    spec = spec or rs.parse_spec(run.spec, stored=True)
    if spec.config_search is None:
        return []
    if searches is None:
        searches = sla_searches(run, spec)
    rows = Measurement.objects.filter(run=run).order_by("id").values("backend", "status")
    ended = run.status in FINAL_STATUSES
    return cs.outcomes(spec, list(rows), searches, cs.skipped_of(run.timings), ended=ended)


def _failed_points_reason(run: Run, errors: list[dict[str, str]]) -> str:
    """A partial run's failure reason (``runners.causes.headline``, as the runner words an
    all-failed run): first line the first failed point's real cause and the next step,
    then how many failed and one line per failed point."""
    failed = list(
        Measurement.objects.filter(run=run, status="failed")
        .order_by("id")
        .values_list("backend", "point_key", "repeat", "error")
    )
    total = run.progress_total or Measurement.objects.filter(run=run).count()
    items = [(f"{b} {p} (repeat {r})", e) for b, p, r, e in failed]
    if not items:
        items = [(str(e.get("where", "?")), str(e.get("message", ""))) for e in errors]
    kept = Measurement.objects.filter(run=run, status="succeeded").count()
    return causes.headline(items, total, kept=kept, model=run.model_id or None)


def ingest_event(run: Run, event: rr.Event) -> str:
    """Apply a runner event; returns the run's status afterwards.

    Raises RunFinished if the run has ended, except for a repeat of the very event that
    ended it (a retried ``finished``), which is accepted and changes nothing;
    IngestRefused for an event that does not fit (``check_event``). The progress total is
    the spec's (set when the run was created), not the runner's.
    """
    event = check_event(run, event)
    now = timezone.now()
    if event.type == "started":
        if run.status in FINAL_STATUSES:
            raise RunFinished(run)
        moved = transition(
            run.pk,
            RunStatus.RUNNING,
            started_at=_when(event.at),
        )
        if not moved:
            run.refresh_from_db(fields=["status", "failure_reason"])
            if run.status in FINAL_STATUSES:
                raise RunFinished(run)
    elif event.type == "environment":
        if run.status in FINAL_STATUSES:
            raise RunFinished(run)
        store_environment(run, event.environment or {}, event.fingerprint or "")
    elif event.type == "progress":
        updated = Run.objects.filter(
            pk=run.pk, status__in=(RunStatus.DISPATCHED, RunStatus.RUNNING)
        ).update(
            progress_done=min(max(0, event.done or 0), run.progress_total or MAX_PROGRESS),
            updated_at=now,
        )
        if not updated:
            run.refresh_from_db(fields=["status", "failure_reason"])
            if run.status in FINAL_STATUSES:
                raise RunFinished(run)
    elif event.type in ("finished", "failed"):
        _finish(run, event, now)
    run.refresh_from_db()
    return run.status


def _finish(run: Run, event: rr.Event, now: datetime) -> None:
    errors = list(event.errors or [])
    common = {
        "finished_at": now,
        "errors": errors,
        "timings": event.timings or {},
    }
    stored = Measurement.objects.filter(run=run, status="succeeded").count()
    expected = expected_measurements(run, timings=event.timings or {})
    if expected < (run.progress_total or expected):
        common["progress_total"] = expected  # an SLA search needed fewer than its budget
    if event.type == "finished" and event.status == "succeeded" and stored < expected:
        # The runner measured everything, but not everything reached PostgreSQL: a page or
        # a gate must never show such a run as complete.
        outcome, to = "partial", RunStatus.FAILED
        reason = (
            f"the runner reported success, but only {stored} of {expected} measurements "
            "reached the portal (a report was refused or lost; see the errors). The runner's "
            "result file has them all; submit the run again."
        )
    elif event.type == "finished" and event.status == "succeeded":
        outcome, to, reason = "succeeded", RunStatus.SUCCEEDED, ""
    elif event.type == "finished":
        outcome, to = "partial", RunStatus.FAILED
        reason = _failed_points_reason(run, errors)
    else:
        outcome, to = "failed", RunStatus.FAILED
        reason = event.message or "the runner reported a failure without a message"
    reason = cap_text(reason)
    done = Measurement.objects.filter(run=run).count()
    moved = transition(
        run.pk, to, outcome=outcome, failure_reason=reason, progress_done=done, **common
    )
    if moved:
        log.info("run %s %s%s", run.short_id, to, f": {reason}" if reason else "")
        if run.holds_slot:  # its runner is about to exit: the next run may start then
            transaction.on_commit(lambda: enqueue_dispatch(None), robust=True)
        return
    run.refresh_from_db(fields=["status", "outcome", "failure_reason"])
    if run.status == to and run.outcome == outcome:
        return  # a retried final event: already applied
    raise RunFinished(run)


_LATENCY_COLUMNS = {
    f"{stat}_{metric}_ms": f"{'p50' if stat == 'median' else stat}_{metric}_ms"
    for metric in rr.LATENCY_METRICS
    for stat in ("mean", "median", "p90", "p99")
}


def measurement_columns(m: rr.Measurement) -> dict[str, Any]:
    """Model fields for a runner measurement (columns + the JSON it came with)."""
    metrics = m.metrics
    server = m.server_metrics.model_dump(mode="json") if m.server_metrics else None
    columns: dict[str, Any] = {
        "backend_kind": m.backend_kind,
        "sweep": m.point.sweep,
        "axis": m.point.axis or "",
        "value": m.point.value,
        "status": m.status,
        "error": m.error or "",
        "input_len": m.point.input_len,
        "output_len": m.point.output_len,
        "concurrency": m.point.max_concurrency,
        "num_prompts": m.point.num_prompts,
        "request_rate": m.point.request_rate,
        "request_throughput": metrics.get("request_throughput"),
        "output_throughput": metrics.get("output_throughput"),
        "total_token_throughput": metrics.get("total_token_throughput"),
        "preemptions": server.get("preemptions") if server else None,
        "kv_cache_usage_peak": server.get("kv_cache_usage_peak") if server else None,
        "prefix_cache_hit_rate": server.get("prefix_cache_hit_rate") if server else None,
        "gpu_memory_peak_bytes": m.gpu_memory_peak_bytes,
        "metrics": metrics,
        "server_metrics": server,
        "raw": m.raw,
        "detail": m.detail,
        "commands": m.commands,
        "conditions": m.conditions,
        "started_at": _when(m.started_at, "started_at"),
        "finished_at": _when(m.finished_at, "finished_at"),
        "duration_s": m.duration_s,
    }
    for key, column in _LATENCY_COLUMNS.items():
        columns[column] = metrics.get(key)
    return columns


def _check_full_samples(run: Run, m: rr.Measurement) -> int:
    """The stored size of the full samples ``m.samples_full`` names, or IngestRefused
    when they were not uploaded (or another upload replaced them)."""
    assert m.samples_full is not None
    name = samplestore.full_name(
        samplestore.object_name(run.public_id, m.backend, m.point.key, m.repeat)
    )
    try:
        stored = samplestore.size(name)
    except Exception as exc:  # the storage is down: the runner retries a 503
        storage_failed(run, exc)
        raise StorageUnavailable(
            f"the samples storage could not be read ({type(exc).__name__}); retry later"
        ) from exc
    if stored is None:
        raise IngestRefused(
            "samples_full",
            "no full samples were uploaded for this measurement: PUT them to "
            f"/api/v1/runner/runs/{run.public_id}/samples first (runners.samplesfile)",
        )
    if stored != m.samples_full.bytes:
        raise IngestRefused(
            "samples_full.bytes",
            f"the uploaded samples are {stored} bytes, not {m.samples_full.bytes}: upload them "
            "again",
        )
    if m.samples_full.kept > m.samples_full.requests:
        raise IngestRefused("samples_full.kept", "the reading sample has more requests than all")
    return stored


def ingest_samples(
    run: Run, backend: str, point_key: str, repeat: int, body: Any, length: int, sha256: str
) -> int:
    """Store the full per-request samples a measurement will name (``runners.samplesfile``)
    from the request ``body`` stream of ``length`` bytes; returns the stored size.
    IngestRefused for a backend, point or repeat the spec does not have; RunFinished once
    the run ended; samplestore.UploadRefused for a body that is not what it claims;
    StorageUnavailable when the storage fails."""
    if run.status in FINAL_STATUSES:
        raise RunFinished(run)
    check_identity(run, backend, point_key, repeat)
    name = samplestore.full_name(samplestore.object_name(run.public_id, backend, point_key, repeat))
    try:
        size = samplestore.save_stream(
            name, body, length, sha256, settings.SERVEBENCH_MAX_SAMPLES_BYTES
        )
    except samplestore.UploadRefused:
        raise
    except Exception as exc:
        log.warning("run %s: samples storage failed: %r", run.short_id, exc)
        storage_failed(run, exc)
        raise StorageUnavailable(
            f"the samples storage could not store these samples ({type(exc).__name__}); retry later"
        ) from exc
    storage_recovered(run)
    log.info(
        "run %s: full samples %s %s #%s (%d bytes)", run.short_id, backend, point_key, repeat, size
    )
    return size


def storage_failed(run: Run, exc: Exception) -> None:
    """Note on the run that its measurements cannot be stored now (the run page shows it
    with what to do), keeping when it started; the cause is scrubbed and capped."""
    where = samplestore.describe()
    cause = scrub(f"{type(exc).__name__}: {exc}")[:300]
    Run.objects.filter(pk=run.pk).update(
        storage_problem=(
            f"The portal cannot store this run's measurements: its samples storage "
            f"({where}) failed ({cause}). The runner keeps each measurement and retries, "
            "so nothing is lost while this lasts, and the run goes on by itself once the "
            "storage answers. Next: whoever runs the portal checks that storage (space, "
            "permissions, credentials, the S3 endpoint) and the portal's log."
        ),
        storage_problem_since=Coalesce(F("storage_problem_since"), Now()),
    )


def storage_recovered(run: Run) -> None:
    """A measurement was stored: the storage answers again."""
    Run.objects.filter(pk=run.pk, storage_problem_since__isnull=False).update(
        storage_problem="", storage_problem_since=None
    )


def ingest_measurement(run: Run, m: rr.Measurement) -> tuple[Measurement, bool]:
    """Store a measurement once: (row, created). A repeat of the same (backend, point,
    repeat) returns the stored row unchanged. RunFinished for a new one on an ended run;
    IngestRefused for one the spec does not have (``check_measurement``)."""
    if run.status in FINAL_STATUSES:  # a retry of a stored one is fine; anything else: stop
        stored = Measurement.objects.filter(
            run=run, backend=m.backend, point_key=m.point.key, repeat=m.repeat
        ).first()
        if stored is not None:
            return stored, False
        raise RunFinished(run)
    m = check_measurement(run, m)
    key = {
        "run": run,
        "backend": m.backend,
        "point_key": m.point.key,
        "repeat": m.repeat,
    }
    existing = Measurement.objects.filter(**key).first()
    if existing is not None:
        return existing, False
    if run.status in FINAL_STATUSES:
        raise RunFinished(run)
    m = energy.apply(run, m)  # energy and cost per token, priced here (benchmarks.energy)
    columns = measurement_columns(m)
    full_bytes = 0
    if m.samples_full is not None:
        full_bytes = _check_full_samples(run, m)
        columns["samples_full"] = m.samples_full.model_dump()
    if m.detail:
        # The bulky per-request arrays go to object storage first, under a name derived
        # from the measurement's identity: a retry rewrites the same object, and the row
        # never points at an object that is not there.
        name = samplestore.object_name(run.public_id, m.backend, m.point.key, m.repeat)
        try:
            size = samplestore.save(name, m.detail)
            if m.telemetry:  # its time series, beside the samples
                size += samplestore.save(samplestore.telemetry_name(name), m.telemetry)
        except Exception as exc:  # OSError, botocore's errors...: the runner retries a 503
            log.warning("run %s: samples storage failed: %r", run.short_id, exc)
            storage_failed(run, exc)
            raise StorageUnavailable(
                f"the samples storage could not store this measurement ({type(exc).__name__}); "
                "retry later"
            ) from exc
        storage_recovered(run)
        columns |= {"detail": {}, "samples": name, "samples_bytes": size + full_bytes}
    try:
        with transaction.atomic():
            row = Measurement.objects.create(**key, **columns)
            refresh_best_throughput([run.pk])  # what the runs list shows of it
    except IntegrityError:
        return Measurement.objects.get(**key), False
    log.info(
        "run %s: measurement %s %s #%s %s", run.short_id, m.backend, m.point.key, m.repeat, m.status
    )
    return row, True
