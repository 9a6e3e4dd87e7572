"""Runs, their measurements and their captured environment. Postgres is the truth.

Facts that lists filter or sort on are real columns (model, GPU, backends, status,
headline metrics); everything else the runner sends is kept as JSON next to them, so the
result document can be rebuilt exactly (``documents.result_document``).
"""

from __future__ import annotations

import secrets
import string

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from portal.lib.logctx import short

_PUBLIC_ID_ALPHABET = string.ascii_lowercase + string.digits
PUBLIC_ID_LENGTH = 20  # ~103 bits: unguessable, and short enough to read out


def new_public_id() -> str:
    return "".join(secrets.choice(_PUBLIC_ID_ALPHABET) for _ in range(PUBLIC_ID_LENGTH))


class RunStatus(models.TextChoices):
    """Lifecycle of a run. Allowed transitions (anything else is a bug):

    - ``queued -> dispatched``: the dispatch task claimed the run and is submitting it.
    - ``queued -> cancelled``: cancelled before any worker picked it up.
    - ``dispatched -> queued``: the executor was temporarily unavailable; dispatch retries.
    - ``dispatched -> running``: the runner reported ``started``.
    - ``dispatched | running -> succeeded``: the runner reported ``finished`` with every
      measurement succeeded.
    - ``dispatched | running -> failed``: the runner reported ``failed`` or ``finished``
      with status ``partial`` (some points failed: the reason lists them), the executor
      could not submit, the runner exited without reporting ("runner lost"), or the
      deadline passed. ``failure_reason`` always says which, in words a person can act on.
    - ``queued | dispatched | running -> cancelled``: a person (or CI) cancelled it.

    ``succeeded``, ``failed`` and ``cancelled`` are final. Every transition is a
    conditional update (``UPDATE ... WHERE status IN (<expected>)``), so a redelivered
    task, a second worker or a late runner event can never move a run backwards.
    """

    QUEUED = "queued", "Queued"
    DISPATCHED = "dispatched", "Dispatched"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


ACTIVE_STATUSES = (RunStatus.QUEUED, RunStatus.DISPATCHED, RunStatus.RUNNING)
FINAL_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)

# to-status -> statuses it may be reached from (see RunStatus).
ALLOWED_FROM: dict[str, tuple[str, ...]] = {
    RunStatus.QUEUED: (RunStatus.DISPATCHED,),
    RunStatus.DISPATCHED: (RunStatus.QUEUED,),
    RunStatus.RUNNING: (RunStatus.DISPATCHED,),
    RunStatus.SUCCEEDED: (RunStatus.DISPATCHED, RunStatus.RUNNING),
    RunStatus.FAILED: (RunStatus.DISPATCHED, RunStatus.RUNNING),
    RunStatus.CANCELLED: ACTIVE_STATUSES,
}


class Run(models.Model):
    """One submitted benchmark spec and its lifecycle."""

    public_id = models.CharField(
        max_length=PUBLIC_ID_LENGTH, unique=True, default=new_public_id, editable=False
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runs"
    )
    name = models.CharField(max_length=200, blank=True)
    spec = models.JSONField(help_text="The validated spec with defaults filled in.")
    spec_version = models.PositiveSmallIntegerField()
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    failure_reason = models.TextField(blank=True)
    outcome = models.CharField(
        max_length=16,
        blank=True,
        help_text="What the runner reported at the end: succeeded, partial or failed.",
    )
    errors = models.JSONField(default=list, blank=True)
    timings = models.JSONField(default=dict, blank=True)
    runner_version = models.CharField(max_length=64, blank=True)

    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    deadline = models.DateTimeField(
        null=True, blank=True, help_text="Set at dispatch: resources.timeout_minutes later."
    )

    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    # What the runs list shows of its results, kept as each measurement is stored
    # (queries.refresh_best_throughput) rather than aggregated on every read of the list.
    best_output_throughput = models.FloatField(
        null=True,
        blank=True,
        help_text=(
            "The highest output tok/s among its succeeded measurements that count "
            "(queries.current: an SLA search's superseded load does not); null before one."
        ),
    )
    # Set while the portal cannot store the run's measurements (its samples storage
    # fails: the runner is answered 503 and retries), cleared by the next one stored; the
    # run page says so instead of a progress that stands still without a word.
    storage_problem = models.TextField(blank=True)
    storage_problem_since = models.DateTimeField(null=True, blank=True)

    executor = models.CharField(max_length=32, blank=True)
    executor_handle = models.JSONField(null=True, blank=True)
    holds_slot = models.BooleanField(
        default=False,
        help_text=(
            "The run occupies one of the executor's slots: set with the claim, cleared once "
            "the executor confirms its runner has exited (not when the run's status ends)."
        ),
    )

    # Filter columns, copied from the spec (and the environment once the runner reports it).
    model_id = models.CharField(max_length=256)
    gpu_name = models.CharField(max_length=128, blank=True)
    gpu_count = models.PositiveSmallIntegerField(null=True, blank=True)
    backends = ArrayField(
        models.CharField(max_length=64),
        default=list,
        blank=True,
        help_text="Backend kinds and names, e.g. ['hf-sequential', 'vllm'].",
    )
    fingerprint = models.CharField(
        max_length=64,
        blank=True,
        help_text=(
            "What the run measured (runners.fingerprint.measurement: workload, points, GPU "
            "type and count): runs with the same fingerprint are comparable."
        ),
    )
    config_fingerprint = models.CharField(
        max_length=64,
        blank=True,
        help_text=(
            "What the run put under test (runners.fingerprint.configuration: model, every "
            "backend's engine and flags): the change a comparison judges."
        ),
    )
    is_public = models.BooleanField(default=False)

    # Fair use (portal.accounts.quotas): the queue takes higher priorities first (the
    # owner's or the token's, as an admin set them when the run was submitted), and a CI
    # token's runs count against the token's own limits.
    priority = models.SmallIntegerField(default=0)
    api_token = models.ForeignKey(
        "accounts.ApiToken",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="submitted_runs",
        help_text="The CI token it was submitted with (none: the web form, a schedule...).",
    )
    schedule = models.ForeignKey(
        "schedules.Schedule",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="runs",
        help_text="The schedule that submitted it (portal.schedules), if one did.",
    )
    # Retention (portal.ops.retention): when the bulky parts were deleted; aggregates stay.
    samples_expired_at = models.DateTimeField(null=True, blank=True)
    telemetry_expired_at = models.DateTimeField(null=True, blank=True)
    logs_expired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # Runs list, "my runs": WHERE owner_id = %s ORDER BY created_at DESC.
            models.Index(fields=["owner", "-created_at"], name="run_owner_created"),
            # A run page's re-runs (reproduce.reruns_of): WHERE name = %s AND owner_id = %s
            # ORDER BY created_at, id; without it, a scan of all the owner's runs.
            models.Index(fields=["owner", "name", "created_at"], name="run_owner_name_created"),
            # Runs list for everyone else: WHERE is_public ORDER BY created_at DESC.
            models.Index(
                fields=["-created_at"], condition=Q(is_public=True), name="run_public_created"
            ),
            # Runs list's page count: SELECT COUNT(*) WHERE (owner_id = %s OR is_public)
            # [AND status = %s]. An index-only scan of this narrow index instead of a scan of
            # the wide rows (the spec JSON): ~1 ms instead of ~10 ms at 10,000 runs.
            models.Index(fields=["is_public", "owner", "status"], name="run_visibility"),
            # Staff list without filters: ORDER BY created_at DESC.
            models.Index(fields=["-created_at"], name="run_created"),
            # Runs list ?status=: WHERE status = %s ORDER BY created_at DESC.
            models.Index(fields=["status", "-created_at"], name="run_status_created"),
            # Runs list ?model=: WHERE model_id = %s ORDER BY created_at DESC.
            models.Index(fields=["model_id", "-created_at"], name="run_model_created"),
            # Runs list ?gpu=: WHERE gpu_name = %s ORDER BY created_at DESC.
            models.Index(fields=["gpu_name", "-created_at"], name="run_gpu_created"),
            # Runs list ?backend=: WHERE backends @> ARRAY[%s].
            GinIndex(fields=["backends"], name="run_backends_gin"),
            # The runs list pager's COUNT(*) with ?model= [&status=]: WHERE model_id = %s
            # [AND status = %s] AND (owner_id = %s OR is_public), index-only (no wide row
            # read; at 100,000 runs ~5x faster than counting through run_model_created).
            models.Index(
                fields=["model_id", "status"],
                include=["owner", "is_public"],
                name="run_model_status_count",
            ),
            # The same for ?gpu= [&status=] [&backend=]: backends is read from the index.
            models.Index(
                fields=["gpu_name", "status"],
                include=["owner", "is_public", "backends"],
                name="run_gpu_status_count",
            ),
            # Reconcile, every period: WHERE status IN ('dispatched', 'running') (and the
            # re-dispatch of stale 'queued' runs). Partial: finished runs are most rows.
            models.Index(
                fields=["status", "created_at"],
                condition=Q(status__in=list(ACTIVE_STATUSES)),
                name="run_active",
            ),
            # Comparison history: WHERE fingerprint = %s ORDER BY created_at DESC; the
            # verdict's noise series adds AND owner_id, status, config_fingerprint (a
            # handful of rows per fingerprint: filtered on the index's rows). Who may see
            # a run (owner_id, is_public), its status, and what the series' stamp and the
            # noise series read (updated_at; public_id, config_fingerprint) are in the
            # index: "the runs of the series this reader sees" and the stamps that key the
            # kept compare and history pages are index-only scans. Without a column they
            # read, the planner ANDed a bitmap of every run the reader may see (all the
            # public runs: growing with the table, 3.5 ms at 100,000 runs on every warm
            # history page) with the fingerprint's.
            models.Index(
                fields=["fingerprint", "-created_at"],
                include=[
                    "id",
                    "owner",
                    "is_public",
                    "status",
                    "updated_at",
                    "public_id",
                    "config_fingerprint",
                ],
                name="run_fingerprint_visible",
            ),
            # The dispatcher's claim order: WHERE status = 'queued'
            # ORDER BY priority DESC, created_at, id (and a queued run's place in it).
            models.Index(
                F("priority").desc(),
                "created_at",
                "id",
                condition=Q(status=RunStatus.QUEUED),
                name="run_queue_order",
            ),
            # Fair use at every submit: WHERE owner_id = %s AND status IN (active), and
            # WHERE api_token_id = %s AND status IN (active).
            models.Index(
                fields=["owner"],
                condition=Q(status__in=list(ACTIVE_STATUSES)),
                name="run_owner_active",
            ),
            models.Index(
                fields=["api_token"],
                condition=Q(status__in=list(ACTIVE_STATUSES)),
                name="run_token_active",
            ),
            # Slot accounting at every dispatch: WHERE holds_slot (a handful of rows).
            models.Index(
                fields=["executor"], condition=Q(holds_slot=True), name="run_slot_holders"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.short_id} {self.name or self.model_id} ({self.status})"

    def get_absolute_url(self) -> str:
        return f"/runs/{self.public_id}/"

    @property
    def short_id(self) -> str:
        """First 8 characters of the public id: what logs and people quote."""
        return short(self.public_id)

    @property
    def backend_display(self) -> list[str]:
        """Each backend once, in the spec's order: its name, and its kind where the name
        differs ("prod (endpoint)"). ``backends`` holds kinds and names together for the
        filter, which would read as two backends. Reads ``backend_specs`` (the spec's
        backends, annotated by ``queries.run_list``) or the spec when it is loaded."""
        found = getattr(self, "backend_specs", None)
        if found is None and "spec" not in self.get_deferred_fields():
            found = (self.spec or {}).get("backends")
        if not isinstance(found, list):
            return list(self.backends)
        out = []
        for backend in found:
            if isinstance(backend, dict):
                kind = str(backend.get("kind") or "")
                name = str(backend.get("name") or kind)
                out.append(name if name == kind or not kind else f"{name} ({kind})")
        return out

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def timeout_minutes(self) -> int:
        return int(self.spec.get("resources", {}).get("timeout_minutes", 180))


class MeasurementStatus(models.TextChoices):
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"


class Measurement(models.Model):
    """One backend at one sweep point, one repeat (``runners.result.Measurement``).

    Identified inside its run by (backend, point_key, repeat): the ingestion endpoint's
    idempotency key, enforced by a unique constraint. Latency columns are in ms; ``p50``
    is vLLM's ``median``.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="measurements")
    backend = models.CharField(max_length=64)
    backend_kind = models.CharField(max_length=32)
    point_key = models.CharField(max_length=128)
    sweep = models.CharField(max_length=64)
    axis = models.CharField(max_length=32, blank=True)
    value = models.FloatField(null=True, blank=True)
    repeat = models.PositiveSmallIntegerField(default=0)
    status = models.CharField(max_length=16, choices=MeasurementStatus.choices)
    error = models.TextField(blank=True)

    input_len = models.PositiveIntegerField()
    output_len = models.PositiveIntegerField()
    concurrency = models.PositiveIntegerField(help_text="The client's max_concurrency.")
    num_prompts = models.PositiveIntegerField()
    request_rate = models.FloatField(null=True, blank=True)

    request_throughput = models.FloatField(null=True, blank=True)
    output_throughput = models.FloatField(null=True, blank=True)
    total_token_throughput = models.FloatField(null=True, blank=True)
    mean_ttft_ms = models.FloatField(null=True, blank=True)
    p50_ttft_ms = models.FloatField(null=True, blank=True)
    p90_ttft_ms = models.FloatField(null=True, blank=True)
    p99_ttft_ms = models.FloatField(null=True, blank=True)
    mean_tpot_ms = models.FloatField(null=True, blank=True)
    p50_tpot_ms = models.FloatField(null=True, blank=True)
    p90_tpot_ms = models.FloatField(null=True, blank=True)
    p99_tpot_ms = models.FloatField(null=True, blank=True)
    mean_itl_ms = models.FloatField(null=True, blank=True)
    p50_itl_ms = models.FloatField(null=True, blank=True)
    p90_itl_ms = models.FloatField(null=True, blank=True)
    p99_itl_ms = models.FloatField(null=True, blank=True)
    mean_e2el_ms = models.FloatField(null=True, blank=True)
    p50_e2el_ms = models.FloatField(null=True, blank=True)
    p90_e2el_ms = models.FloatField(null=True, blank=True)
    p99_e2el_ms = models.FloatField(null=True, blank=True)
    preemptions = models.FloatField(null=True, blank=True)
    kv_cache_usage_peak = models.FloatField(null=True, blank=True, help_text="0..1")
    gpu_memory_peak_bytes = models.BigIntegerField(null=True, blank=True)
    prefix_cache_hit_rate = models.FloatField(null=True, blank=True, help_text="0..1")
    conditions = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            "How the point was measured (runners.result.Measurement.conditions): cores owned, "
            "threads, host load, CPU steal, CPU time against wall time, and whether it was "
            "contended, with the reasons."
        ),
    )

    metrics = models.JSONField(default=dict, blank=True, help_text="Every metric key sent.")
    server_metrics = models.JSONField(null=True, blank=True)
    raw = models.JSONField(default=dict, blank=True, help_text="The client's JSON output.")
    detail = models.JSONField(
        default=dict,
        blank=True,
        help_text="Per-request arrays of measurements stored before samples moved out; {} since.",
    )
    samples = models.CharField(
        max_length=200,
        blank=True,
        help_text=(
            "Name of the per-request arrays' object in the 'samples' storage "
            "(portal.benchmarks.samplestore); empty when they are in 'detail' or absent."
        ),
    )
    samples_bytes = models.BigIntegerField(
        null=True, blank=True, help_text="Compressed size of the samples object(s)."
    )
    samples_full = models.JSONField(
        default=dict,
        blank=True,
        help_text=(
            "When the arrays were too large to travel inline (runners.samplesfile): the full "
            "arrays' requests, bytes and SHA-256 (stored under samplestore.full_name); "
            "'samples' is then a reading sample of 'kept' requests. {} otherwise."
        ),
    )
    commands = models.JSONField(default=dict, blank=True)

    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    duration_s = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    # Large JSON columns that list and page queries leave out (``.defer(*HEAVY_FIELDS)``).
    HEAVY_FIELDS = ("raw", "detail", "commands")

    class Meta:
        ordering = ["id"]
        constraints = [
            # Ingestion idempotency; its index also serves the run page's
            # WHERE run_id = %s (all measurements of one run).
            models.UniqueConstraint(
                fields=["run", "backend", "point_key", "repeat"], name="measurement_identity"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.backend} {self.point_key} #{self.repeat}"


class Environment(models.Model):
    """The software and hardware the runner found, captured before loading anything."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="environment")
    snapshot = models.JSONField(help_text="runners.environment.capture(), as sent.")
    fingerprint = models.CharField(
        max_length=64, blank=True, help_text="The runner's hash of the comparability fields."
    )
    gpu_name = models.CharField(max_length=128, blank=True)
    gpu_count = models.PositiveSmallIntegerField(null=True, blank=True)
    driver = models.CharField(max_length=64, blank=True)
    cuda = models.CharField(max_length=32, blank=True)
    vllm_version = models.CharField(max_length=64, blank=True)
    torch_version = models.CharField(max_length=64, blank=True)
    transformers_version = models.CharField(max_length=64, blank=True)
    captured_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.gpu_name or 'CPU'} x{self.gpu_count or 0}, vLLM {self.vllm_version or '-'}"


BASELINE_LABEL_MAX = 100


class Baseline(models.Model):
    """A run marked as a baseline under a label (a branch name, ``main``, ``nightly``).

    A *series* is the runs that share a fingerprint (``Run.fingerprint``: model, workload,
    sweeps, engine config, GPU type and count) and were marked with the same label.
    ``latest:<label>`` resolves to the newest succeeded run of the series
    (``portal.benchmarks.baselines.resolve``), so CI marks each run of its main branch and
    pull requests compare against the newest one. Marks accumulate; unmarking a bad run
    makes the previous one the baseline again.

    The fingerprint is read from the run, not copied here: a run's fingerprint gains the
    real GPU name when the runner reports its environment, which may be after the mark.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="baseline_marks")
    label = models.CharField(max_length=BASELINE_LABEL_MAX)
    set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    set_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-set_at", "-id"]
        constraints = [
            # One mark per (run, label); its index also serves "the labels of this run".
            models.UniqueConstraint(fields=["run", "label"], name="baseline_run_label"),
        ]
        indexes = [
            # latest:<label> and the baselines list: WHERE label = %s, joined to the run
            # (fingerprint, status, owner) and ordered by the run's created_at.
            models.Index(fields=["label", "run"], name="baseline_label_run"),
        ]

    def __str__(self) -> str:
        return f"{self.label}: {self.run.short_id}"
