"""Read-side helpers shared by the REST API and the web pages: who sees what, list filters.

- ``run_access(user, run)``: THE access rule, one place for every page and endpoint:
  ``MANAGE`` for the owner and active staff (cancel, share, re-run, mark baselines, read
  the runner's log and full failure reasons), ``VIEW`` for anyone when the run is public,
  ``NONE`` otherwise. ``may_view`` / ``may_manage`` read it; ``visible_runs`` is the same
  rule as a query (a test keeps the two equal).
- ``visible_runs(user)``: the runs a user may read (own, public; staff: all).
- ``RunFilters.from_params(request.GET)`` then ``run_list(user, filters)``: the runs list
  with filters (model, gpu, backend, status, owner), newest first, owner joined, the spec
  JSON left out. Query count is constant whatever the page size. ``count_runs(user,
  filters)``: how many it holds, exactly (the API's pager).
- ``filter_choices(user)``: distinct values for the list's filter drop-downs.
- ``get_visible_run(user, public_id)``: one run or ``Run.DoesNotExist`` (answer 404 both
  for "no such run" and "not yours", so ids do not leak). A unique prefix of a public id
  (``MIN_ID_PREFIX`` characters or more, e.g. the 8-character short id every page shows)
  names the run too, among the runs ``user`` may read only; several such runs raise
  ``AmbiguousRunId`` (a ``Run.DoesNotExist``, so callers that do not tell the two apart
  still answer 404).
- ``run_measurements(run)``: a run's measurements in chart order, heavy JSON deferred.
- ``current(measurements)``: less what an SLA search's confirmation superseded, in SQL,
  for aggregates that never parse a spec (history, the noise series, the best below).
- ``refresh_best_throughput(run_ids)``: keeps ``Run.best_output_throughput``, the best
  output tok/s the runs list shows; ingestion calls it with each measurement it stores.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.contrib.postgres.expressions import ArraySubquery
from django.core.cache import cache
from django.db import transaction
from django.db.models import Exists, F, Max, OuterRef, Q, QuerySet, Subquery, TextField, Value
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Coalesce

from portal.benchmarks.models import PUBLIC_ID_LENGTH, Baseline, Measurement, Run, RunStatus
from runners.choices import choice_message

# Columns the runs list never shows; leaving them out keeps list pages light.
LIST_DEFERRED = ("spec", "errors", "timings", "executor_handle")


class FilterError(ValueError):
    """A filter value that cannot match anything: ``field`` names the query parameter."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


class Access(enum.IntEnum):
    """What a user may do with a run; each level includes the ones below it."""

    NONE = 0
    VIEW = 1
    MANAGE = 2


def _is_staff(user: AbstractBaseUser | AnonymousUser) -> bool:
    return bool(user.is_authenticated and user.is_active and getattr(user, "is_staff", False))


def run_access(user: AbstractBaseUser | AnonymousUser | None, run: Run) -> Access:
    """The one access rule (see the module docstring)."""
    active = user is not None and user.is_authenticated and user.is_active
    if active and (run.owner_id == user.pk or _is_staff(user)):
        return Access.MANAGE
    return Access.VIEW if run.is_public else Access.NONE


def may_view(user: AbstractBaseUser | AnonymousUser | None, run: Run) -> bool:
    """May ``user`` read the run (its page, results, spec)?"""
    return run_access(user, run) >= Access.VIEW


def may_manage(user: AbstractBaseUser | AnonymousUser | None, run: Run) -> bool:
    """May ``user`` act on the run and read what only its owner reads (log tails, whole
    failure reasons)? The owner and staff; a public run is readable, not manageable."""
    return run_access(user, run) >= Access.MANAGE


# The names the rest of the code grew up with; both are the rule above.
can_view = may_view
can_cancel = may_manage


def visible_runs(user: AbstractBaseUser | AnonymousUser) -> QuerySet[Run]:
    """Runs ``user`` may read, as a query: ``may_view`` for every run at once."""
    runs = Run.objects.all()
    if _is_staff(user):
        return runs
    if user.is_authenticated and user.is_active:
        return runs.filter(Q(owner=user) | Q(is_public=True))
    return runs.filter(is_public=True)


# The shortest id prefix that names a run (git's minimum); short ids have 8 characters.
MIN_ID_PREFIX = 4


class AmbiguousRunId(Run.DoesNotExist):
    """An id prefix that starts several runs the user may read. ``matches`` holds a few of
    them (visible ones only: nothing about other users' private runs leaks)."""

    def __init__(self, prefix: str, matches: list[Run]):
        self.prefix = prefix
        self.matches = matches
        super().__init__(
            f"{prefix!r} is the start of more than one run id you can see; give more of the "
            "id (the run's page shows all 20 characters)"
        )


def labels(run: OuterRef | F) -> ArraySubquery:
    """The labels of the run ``run`` refers to, as one array column (a subquery on the
    (run, label) unique index; readers sort them, ``sorted_labels``): pages show a run's
    labels without a query of their own. Unordered: an ORDER BY made Postgres set up a
    sort per run (~70 us each: 2 ms for the runs list's 25, 70 ms for a 1,000-run
    history) for lists that hold a label or two."""
    return ArraySubquery(Baseline.objects.filter(run_id=run).order_by().values("label"))


def sorted_labels(found: Iterable[str] | None) -> list[str]:
    """A ``labels`` column as pages show it: sorted."""
    return sorted(found or ())


def get_visible_run(user: AbstractBaseUser | AnonymousUser, public_id: str) -> Run:
    """The run whose public id is ``public_id``, or starts with it (a unique prefix of at
    least MIN_ID_PREFIX characters), if ``user`` may read it; ``Run.DoesNotExist`` when
    there is none, ``AmbiguousRunId`` when several runs ``user`` may read start with it.

    A full id is one indexed lookup; a prefix is looked up among the visible runs only.
    """
    runs = visible_runs(user).select_related("owner").annotate(label_list=labels(OuterRef("pk")))
    if len(public_id) >= PUBLIC_ID_LENGTH:
        return runs.get(public_id=public_id)
    if len(public_id) < MIN_ID_PREFIX:
        raise Run.DoesNotExist(
            f"{public_id!r} is too short to name a run; give at least {MIN_ID_PREFIX} "
            "characters of its id"
        )
    matches = list(runs.filter(public_id__startswith=public_id).order_by("-created_at")[:5])
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise AmbiguousRunId(public_id, matches)
    raise Run.DoesNotExist(f"no run id that you can see starts with {public_id!r}")


@dataclass(frozen=True)
class RunFilters:
    """The runs list's filters; empty strings mean "any".

    ``owner`` is ``"me"`` (the requesting user) or a username.
    """

    model: str = ""
    gpu: str = ""
    backend: str = ""
    status: str = ""
    owner: str = ""

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> RunFilters:
        """Read filters from a query dict (``request.GET``); FilterError on a bad status."""
        values = {f.name: str(params.get(f.name, "") or "").strip()[:256] for f in fields(cls)}
        if values["status"] and values["status"] not in RunStatus.values:
            raise FilterError(
                "status",
                choice_message(values["status"], RunStatus.values, "status"),
            )
        return cls(**values)

    def is_empty(self) -> bool:
        return not any(getattr(self, f.name) for f in fields(self))

    def apply(self, runs: QuerySet[Run], user: AbstractBaseUser | AnonymousUser) -> QuerySet[Run]:
        if self.model:
            runs = runs.filter(model_id=self.model)
        if self.gpu:
            runs = runs.filter(gpu_name=self.gpu)
        if self.backend:
            runs = runs.filter(backends__contains=[self.backend])
        if self.status:
            runs = runs.filter(status=self.status)
        if self.owner == "me":
            runs = runs.filter(owner=user) if user.is_authenticated else runs.none()
        elif self.owner:
            runs = runs.filter(owner__username=self.owner)
        return runs

    def as_params(self) -> dict[str, str]:
        """The non-empty filters, for building pagination links."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}


def run_list(
    user: AbstractBaseUser | AnonymousUser, filters: RunFilters | None = None
) -> QuerySet[Run]:
    """The runs list: visible to ``user``, filtered, newest first, ready to paginate."""
    runs = visible_runs(user)
    if filters is not None:
        runs = filters.apply(runs, user)
    return (
        runs.select_related("owner")
        .defer(*LIST_DEFERRED)
        .annotate(
            label_list=labels(OuterRef("pk")),
            backend_specs=KeyTransform("backends", "spec"),  # Run.backend_display
        )
        .order_by("-created_at", "-id")
    )


def count_runs(user: AbstractBaseUser | AnonymousUser, filters: RunFilters | None = None) -> int:
    """How many runs ``run_list(user, filters)`` holds, exactly. Unfiltered, for a signed-in
    reader who is not staff, as two counts: the public runs and the reader's private ones,
    each an index-only scan of an index of its own (``run_public_created``,
    ``run_visibility``); counted as one OR, PostgreSQL read the whole visibility index,
    every run in the table (8-12 ms at 100,000 runs, the two counts 4-6). A filter's
    index (``run_model_status_count``, ``run_gpu_status_count``) holds the owner and
    ``is_public``, so a filtered list is counted as one OR over it."""
    unfiltered = filters is None or filters.is_empty()
    if unfiltered and user.is_authenticated and user.is_active and not _is_staff(user):
        runs = Run.objects.order_by()
        public = runs.filter(is_public=True).count()
        return public + runs.filter(is_public=False, owner=user).count()
    runs = visible_runs(user)
    return (runs if filters is None else filters.apply(runs, user)).order_by().count()


def best_throughput() -> Subquery:
    """The highest output tok/s of a run's (``OuterRef("pk")``) succeeded measurements
    that count (``current``), None without one: a subquery on the (run, ...) index."""
    best = (
        current(Measurement.objects.filter(run_id=OuterRef("pk"), status="succeeded"))
        .order_by()
        .values("run_id")
        .annotate(best=Max("output_throughput"))
        .values("best")
    )
    return Subquery(best)


def refresh_best_throughput(run_ids: Iterable[int] | QuerySet[Any]) -> None:
    """Keep ``Run.best_output_throughput`` of these runs (ids, or a query of their pks):
    ingestion calls it with each measurement it stores, so the runs list reads a column
    instead of aggregating every run of its page (a subquery whose building, planning and
    running cost the list more than everything else it does)."""
    ids = run_ids if isinstance(run_ids, QuerySet) else list(run_ids)
    runs = Run.objects.filter(pk__in=ids)
    with transaction.atomic():
        # The rows locked first: a concurrent refresh of the same run waits for this one's
        # commit, then computes in a new snapshot that holds this one's measurement (an
        # UPDATE that waited would compute in the snapshot it started with, without it).
        # FOR NO KEY UPDATE, as the UPDATE itself: storing a measurement holds its run's
        # row FOR KEY SHARE (the foreign key), which FOR UPDATE would wait on: deadlock.
        list(runs.select_for_update(no_key=True).order_by("pk").values_list("pk", flat=True))
        runs.update(best_output_throughput=best_throughput())


CHOICES_TTL_SECONDS = 60


def filter_choices(user: AbstractBaseUser | AnonymousUser) -> dict[str, list[str]]:
    """Distinct models, GPUs and backends among the runs ``user`` sees, for drop-downs.

    Three DISTINCT queries, cached per user (and once for all anonymous visitors) for
    CHOICES_TTL_SECONDS: a new model shows up in the filters within a minute.
    """
    key = f"servebench:filter-choices:{user.pk if user.is_authenticated else 'anon'}"
    return cache.get_or_set(key, lambda: _filter_choices(user), CHOICES_TTL_SECONDS)


def _filter_choices(user: AbstractBaseUser | AnonymousUser) -> dict[str, list[str]]:
    runs = visible_runs(user).order_by()
    models = runs.exclude(model_id="").values_list("model_id", flat=True).distinct()
    gpus = runs.exclude(gpu_name="").values_list("gpu_name", flat=True).distinct()
    backends = runs.values_list("backends", flat=True).distinct()
    return {
        "model": sorted(models),
        "gpu": sorted(gpus),
        "backend": sorted({b for group in backends for b in group}),
        "status": list(RunStatus.values),
    }


def run_measurements(run: Run, *, heavy: bool = False) -> QuerySet[Measurement]:
    """A run's measurements ordered for tables and charts (backend, sweep, value, repeat).

    ``heavy=False`` leaves out raw client output and per-request arrays.
    """
    measurements = Measurement.objects.filter(run=run).order_by(
        "backend", "sweep", "value", "repeat", "id"
    )
    if not heavy:
        measurements = measurements.defer(*Measurement.HEAVY_FIELDS)
    return measurements


def current(measurements: QuerySet[Measurement]) -> QuerySet[Measurement]:
    """``measurements`` less the SLA search loads a confirmation superseded: repeat 0 of a
    point of the run's search (its sweep is the search's name) measured again at repeat
    1. The SQL form of ``runners.sla.superseded``, for aggregates over many runs that
    parse no spec; ingestion stores repeat 1 of a search load only as the confirmation of
    a miss at repeat 0, so the sibling's existence is the whole rule. One EXISTS over the
    (run, backend, point_key, repeat) unique index; the run's spec is read inside it, for
    the rare sibling found, so the outer query joins no run (a join made the planner hash
    every run in the table, growing with it)."""
    search = Coalesce(
        KeyTextTransform("name", KeyTransform("sla_search", "run__spec")),
        Value(""),
        output_field=TextField(),
    )
    confirmed = (
        Measurement.objects.filter(
            run_id=OuterRef("run_id"),
            backend=OuterRef("backend"),
            point_key=OuterRef("point_key"),
            sweep=OuterRef("sweep"),
            repeat=1,
        )
        .alias(_search=search)
        .filter(sweep=F("_search"))
        .exclude(_search="")
    )
    return measurements.exclude(Q(repeat=0) & Exists(confirmed))
