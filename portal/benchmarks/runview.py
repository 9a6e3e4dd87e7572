"""A run loaded once: the value every reader of a run's results takes.

The run page, compare, the history link, the reproduce section, the SLA-search section
and the result API all need the same few things about a run: its row, its spec parsed
(stored specs are parsed with ``parse_spec(stored=True)``), its environment snapshot,
its comparable identity and its aggregated points. ``load`` and ``load_many`` read them
in a fixed number of queries and parse the spec once; the readers take the
``LoadedRun`` and never go back to the database or the parser for these.

Queries: ``load_many`` (any number of runs): the environments (one), and with
``results=True`` the measurements (one) and, when a run has an SLO whose goodput the
client did not report, the per-request arrays that goodput needs (one).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from portal.benchmarks import ingestion
from portal.benchmarks import points as pts
from portal.benchmarks.models import Environment, Measurement, Run
from runners import fingerprint as rf
from runners import spec as rs


@dataclass(eq=False)
class LoadedRun:
    """One run with what its readers need, each read or parsed once (module docstring).

    ``spec`` is None when the stored spec no longer parses (a spec from a version whose
    fields were later removed); readers then show what the row itself holds.
    """

    run: Run
    spec: rs.Spec | None
    environment: Environment | None
    measurements: list[Measurement] = field(default_factory=list)
    results: pts.RunResults | None = None

    @property
    def snapshot(self) -> dict[str, Any]:
        """The environment the runner captured (credentials were removed at ingestion);
        {} before the runner reported it."""
        env = self.environment
        return env.snapshot if env is not None and isinstance(env.snapshot, dict) else {}

    @property
    def slo(self) -> dict[str, float] | None:
        return pts.spec_slo(self.spec)

    @cached_property
    def identity(self) -> rf.Identity | None:
        """What the run measured and what it put under test (``runners.fingerprint``),
        computed from its spec and environment; None when the spec does not parse."""
        if self.spec is None:
            return None
        return rf.Identity.of(self.spec, self.snapshot or None)

    @cached_property
    def sla_searches(self) -> list[dict[str, Any]]:
        """The run's SLA search answers and paths (``ingestion.sla_searches``), read once
        for every section that shows them; [] without a search or a parsed spec."""
        if self.spec is None or self.spec.sla_search is None:
            return []
        return ingestion.sla_searches(self.run, self.spec)

    @property
    def series_key(self) -> str:
        """The key of the series this run belongs to (its history page's)."""
        return self.run.fingerprint


def _parse(run: Run) -> rs.Spec | None:
    return pts.stored_spec(run.spec)


def load_many(runs: Sequence[Run], *, results: bool = True) -> list[LoadedRun]:
    """``runs`` loaded (in their order), with their points when ``results``."""
    pks = [r.pk for r in runs]
    environments = {e.run_id: e for e in Environment.objects.filter(run_id__in=pks)}
    views = [LoadedRun(r, _parse(r), environments.get(r.pk)) for r in runs]
    if results and views:
        _attach_results(views)
    return views


def load(run: Run, *, results: bool = True) -> LoadedRun:
    """One run loaded (``load_many`` of one)."""
    return load_many([run], results=results)[0]


def _attach_results(views: Iterable[LoadedRun]) -> None:
    by_pk = {v.run.pk: v for v in views}
    rows: dict[int, list[Measurement]] = defaultdict(list)
    query = (
        Measurement.objects.filter(run_id__in=list(by_pk))
        .defer(*Measurement.HEAVY_FIELDS)
        .order_by("run_id", "backend", "sweep", "value", "repeat", "id")
    )
    for m in query:
        rows[m.run_id].append(m)
    for pk, view in by_pk.items():
        view.measurements = pts.without_superseded(view.spec, rows.get(pk, []))
    slos = {pk: v.slo for pk, v in by_pk.items()}
    everything = [m for v in by_pk.values() for m in v.measurements]
    extra = pts.goodput_extra(everything, lambda m: slos.get(m.run_id))
    for view in by_pk.values():
        server = [m.server_metrics for m in view.measurements if isinstance(m.server_metrics, dict)]
        view.results = pts.RunResults(
            pts.aggregate(view.measurements, extra),
            view.slo,
            server,
            pts.spec_sweeps(view.run.spec),
        )
