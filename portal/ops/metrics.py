"""The portal's own metrics: ``GET /metrics`` in Prometheus' text format (version 0.0.4).

Multi-process safe by construction: nothing is kept in a process's memory. Gauges and
histograms are computed from PostgreSQL at scrape time (a handful of aggregate queries);
counters of events that leave no row (5xx answers, refused runner reports) are totals in
Redis (``portal.ops.counters``) that every web process adds to.

========================================  =========  =====================================
metric                                    type       from
========================================  =========  =====================================
servebench_runs{executor,status}          gauge      active runs (queued: the executor
                                                     they will go to)
servebench_slots{executor,state}          gauge      the local executor's slots
servebench_dispatch_latency_seconds       histogram  created -> dispatched, every run
servebench_run_duration_seconds{outcome}  histogram  started -> finished, ended runs
servebench_ingestion_refusals_total       counter    runner reports answered 400, by field
servebench_http_5xx_total{status}         counter    5xx answers of any page or API
servebench_alert_deliveries{channel,      gauge      alert deliveries by state
  status}
servebench_schedules{state}               gauge      enabled / paused schedules
servebench_counters_up                    gauge      1 when Redis' counters answered
========================================  =========  =====================================

The histograms are cumulative over every stored run (as a process' histogram is over its
lifetime), so ``rate()`` and ``histogram_quantile()`` work on them as usual.

Access (``allowed``): off unless ``SERVEBENCH_METRICS_TOKEN`` (``Authorization: Bearer``)
or ``SERVEBENCH_METRICS_NETWORKS`` (the scraper's address, REMOTE_ADDR) is set; either one
admits. ``portal.ops.middleware`` answers ``/metrics`` before Django checks the Host
header, since Prometheus scrapes pods by address.

Written here rather than with ``prometheus_client``: the portal's image does not carry it
(requirements/portal.txt), and the text format of a few families is small.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from collections.abc import Iterable, Sequence
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.http import HttpRequest, HttpResponse

from portal.alerts.models import Delivery
from portal.benchmarks.models import ACTIVE_STATUSES, FINAL_STATUSES, Run, RunStatus
from portal.ops import counters
from portal.schedules.models import Schedule

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DISPATCH_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
DURATION_BUCKETS = (60, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400)


# --------------------------------------------------------------------------- access


def enabled() -> bool:
    return bool(settings.SERVEBENCH_METRICS_TOKEN or settings.SERVEBENCH_METRICS_NETWORKS)


def allowed(request: HttpRequest) -> bool:
    """The scraper sent the token, or comes from an allowed network."""
    token = settings.SERVEBENCH_METRICS_TOKEN
    if token:
        scheme, _, value = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(value.strip(), token):
            return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(
        address in ipaddress.ip_network(net, strict=False)
        for net in settings.SERVEBENCH_METRICS_NETWORKS
    )


def endpoint(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: 401 without the token, 405 for other methods."""
    if request.method not in ("GET", "HEAD"):
        response = HttpResponse("GET only\n", status=405, content_type="text/plain")
        response["Allow"] = "GET, HEAD"
        return response
    if not allowed(request):
        response = HttpResponse(
            "send Authorization: Bearer <SERVEBENCH_METRICS_TOKEN>\n",
            status=401,
            content_type="text/plain",
        )
        response["WWW-Authenticate"] = 'Bearer realm="servebench-metrics"'
        return response
    response = HttpResponse(render(), content_type=CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response


# --------------------------------------------------------------------------- format


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class Family:
    """One metric family's lines: HELP, TYPE, samples."""

    def __init__(self, name: str, kind: str, help_text: str):
        self.name = name
        self.lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, value: float, suffix: str = "", **labels: str) -> None:
        self.lines.append(f"{self.name}{suffix}{_labels(labels)} {_number(value)}")

    def histogram(
        self,
        buckets: Sequence[float],
        cumulative: Sequence[int],
        total: int,
        seconds: float,
        **labels: str,
    ) -> None:
        for bound, count in zip(buckets, cumulative, strict=True):
            self.sample(count, "_bucket", **labels, le=_number(bound))
        self.sample(total, "_bucket", **labels, le="+Inf")
        self.sample(seconds, "_sum", **labels)
        self.sample(total, "_count", **labels)


def _seconds(value: timedelta | None) -> float:
    return round(value.total_seconds(), 3) if value else 0.0


# --------------------------------------------------------------------------- families


def _runs() -> Iterable[Family]:
    runs = Family("servebench_runs", "gauge", "Active runs by executor and status.")
    found = {
        (executor or settings.SERVEBENCH_EXECUTOR, status): count
        for executor, status, count in Run.objects.filter(status__in=ACTIVE_STATUSES)
        .values_list("executor", "status")
        .annotate(n=Count("id"))
        .values_list("executor", "status", "n")
    }
    found.setdefault((settings.SERVEBENCH_EXECUTOR, RunStatus.QUEUED), 0)
    for (executor, status), count in sorted(found.items()):
        runs.sample(count, executor=executor, status=str(status))
    yield runs
    if settings.SERVEBENCH_EXECUTOR == "local":
        slots = Family("servebench_slots", "gauge", "The local executor's slots.")
        busy = Run.objects.filter(holds_slot=True, executor="local").count()
        slots.sample(settings.SERVEBENCH_LOCAL_SLOTS, executor="local", state="total")
        slots.sample(busy, executor="local", state="busy")
        yield slots


def _dispatch_latency() -> Family:
    family = Family(
        "servebench_dispatch_latency_seconds",
        "histogram",
        "Time from a run's submission to its dispatch.",
    )
    latency = ExpressionWrapper(F("dispatched_at") - F("created_at"), output_field=DurationField())
    rows = Run.objects.filter(dispatched_at__isnull=False).annotate(latency=latency)
    agg = rows.aggregate(
        total=Count("id"),
        seconds=Sum("latency"),
        **{
            f"b{i}": Count("id", filter=Q(latency__lte=timedelta(seconds=bound)))
            for i, bound in enumerate(DISPATCH_BUCKETS)
        },
    )
    family.histogram(
        DISPATCH_BUCKETS,
        [agg[f"b{i}"] for i in range(len(DISPATCH_BUCKETS))],
        agg["total"],
        _seconds(agg["seconds"]),
    )
    return family


def _run_durations() -> Family:
    family = Family(
        "servebench_run_duration_seconds",
        "histogram",
        "Time from a runner's start to the run's end, by outcome.",
    )
    duration = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    rows = (
        Run.objects.filter(
            status__in=FINAL_STATUSES, started_at__isnull=False, finished_at__isnull=False
        )
        .annotate(duration=duration)
        .values("status")
        .annotate(
            total=Count("id"),
            seconds=Sum("duration"),
            **{
                f"b{i}": Count("id", filter=Q(duration__lte=timedelta(seconds=bound)))
                for i, bound in enumerate(DURATION_BUCKETS)
            },
        )
    )
    found = {row["status"]: row for row in rows}
    for outcome in FINAL_STATUSES:
        row = found.get(outcome, {})
        family.histogram(
            DURATION_BUCKETS,
            [row.get(f"b{i}", 0) for i in range(len(DURATION_BUCKETS))],
            row.get("total", 0),
            _seconds(row.get("seconds")),
            outcome=str(outcome),
        )
    return family


def _totals() -> Iterable[Family]:
    up = Family("servebench_counters_up", "gauge", "1 when the counters in Redis answered.")
    refusals = counters.totals("ingestion_refusals")
    errors = counters.totals("http_5xx")
    up.sample(1 if refusals is not None and errors is not None else 0)
    yield up
    family = Family(
        "servebench_ingestion_refusals_total",
        "counter",
        "Runner reports refused (HTTP 400), by the field at fault.",
    )
    for field, count in sorted((refusals or {}).items()):
        family.sample(count, field=field)
    yield family
    family = Family("servebench_http_5xx_total", "counter", "5xx answers, by status code.")
    for status, count in sorted((errors or {}).items()):
        family.sample(count, status=status)
    yield family


def _others() -> Iterable[Family]:
    family = Family("servebench_alert_deliveries", "gauge", "Alert deliveries by state.")
    for channel, status, count in (
        Delivery.objects.values_list("channel", "status")
        .annotate(n=Count("id"))
        .values_list("channel", "status", "n")
        .order_by("channel", "status")
    ):
        family.sample(count, channel=channel, status=status)
    yield family
    family = Family("servebench_schedules", "gauge", "Schedules, enabled or paused.")
    states = dict(Schedule.objects.values_list("enabled").annotate(n=Count("id")))
    family.sample(states.get(True, 0), state="enabled")
    family.sample(states.get(False, 0), state="paused")
    yield family


def render() -> str:
    """The exposition text of every family."""
    families: list[Family] = [*_runs(), _dispatch_latency(), _run_durations()]
    families += [*_totals(), *_others()]
    return "\n".join(line for family in families for line in family.lines) + "\n"


_SEGMENT = re.compile(r"^[a-z_][a-z0-9_]{0,39}\Z")


def refusal_label(field: str) -> str:
    """A refused field as a label of bounded variety: list indices become ``N``, names
    that are not identifiers (a metric's or an object key's) become ``*``, at most three
    levels (``point.key``, ``metrics.*``, ``errors.N.message``)."""
    if not field:
        return "body"
    parts = []
    for part in field.split(".")[:3]:
        if part.isdigit():
            parts.append("N")
        elif _SEGMENT.match(part):
            parts.append(part)
        else:
            parts.append("*")
    return ".".join(parts)
