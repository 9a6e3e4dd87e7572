"""The runs table's rows (runs list, home page) and the history table's, rendered in Python.

The same cells ``web/_run_table.html`` and ``web/_history_body.html`` had as template
code, built with one f-string per row: the runs list is the page readers open most, and
25 rows of template lookups and filters cost it more than its queries; the history's 100
rows of dates and numbers cost its first visit more than reading 1,000 runs. Every value
is escaped here (``escape``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import tzinfo
from typing import Any

from django.template.defaultfilters import floatformat, timesince_filter
from django.utils import timezone
from django.utils.html import conditional_escape as escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import template_localtime

from portal.benchmarks.models import RunStatus
from portal.benchmarks.queries import sorted_labels

LIVE = ("running", "dispatched")


# What a status reads as (Run.get_status_display, without its per-call field lookup).
STATUS_WORDS = dict(RunStatus.choices)


def run_rows(runs: Iterable[Any], selectable: bool = False) -> SafeString:
    """The ``<tr>`` of each run: name and labels, status (progress while live), best
    output tok/s, model, GPU, backends, owner, age."""
    zone = timezone.get_current_timezone()
    return mark_safe("".join(_row(run, selectable, zone) for run in runs))  # noqa: S308 - escaped


def _row(run: Any, selectable: bool, zone: tzinfo) -> str:
    short = escape(run.short_id)
    pick = (
        f'<td><input type="checkbox" name="runs" value="{escape(run.public_id)}" '
        f'aria-label="select {short}"></td>'
        if selectable
        else ""
    )
    labels = "".join(
        f' <span class="badge label" title="label: latest:{escape(label)} finds it">'
        f"{escape(label)}</span>"
        for label in sorted_labels(getattr(run, "label_list", None))
    )
    progress = (
        f'<br><span class="muted">{escape(run.progress_done)}/{escape(run.progress_total)}</span>'
        if run.status in LIVE
        else ""
    )
    best = getattr(run, "best_output_throughput", None)
    times = f" \N{MULTIPLICATION SIGN}{escape(run.gpu_count)}" if run.gpu_count else ""
    gpu = escape(run.gpu_name or "—") + times
    created = run.created_at.astimezone(zone)  # as template_localtime, for an aware time
    return (
        f"<tr>{pick}"
        f'<td class="run-col"><a href="{escape(run.get_absolute_url())}">'
        f"{escape(run.name or run.short_id)}</a><br>"
        f'<span class="muted mono">{short}</span>{labels}</td>'
        f'<td><span class="badge {escape(run.status)}">'
        f"{escape(STATUS_WORDS.get(run.status, run.status))}</span>"
        f"{progress}</td>"
        f'<td class="num">{escape(floatformat(best, 1)) if best else "—"}</td>'
        f'<td class="mono">{escape(run.model_id)}</td>'
        f"<td>{gpu}</td>"
        f"<td>{', '.join(escape(b) for b in run.backend_display)}</td>"
        f"<td>{escape(run.owner.get_username())}</td>"
        f'<td title="{escape(created.isoformat())}">{escape(timesince_filter(created))} ago'
        "</td></tr>"
    )


def history_rows(points: Iterable[Any]) -> SafeString:
    """The history table's ``<tr>`` per run (``portal.benchmarks.history.HistoryPoint``):
    submitted, run and labels, value ± spread, repeats, versions, what changed."""
    return mark_safe("".join(_history_row(p) for p in points))  # noqa: S308 - escaped


def _history_row(p: Any) -> str:
    created = template_localtime(p.created_at)
    labels = "".join(f' <span class="badge label">{escape(label)}</span>' for label in p.labels)
    spread = f'<span class="spread">± {floatformat(p.std, 2)}</span>' if p.std else ""
    versions = "".join(
        f'<td class="mono">{escape(p.versions.get(name) or "—")}</td>'
        for name in ("vLLM", "PyTorch", "Driver")
    )
    return (
        f'<tr><td data-sort="{escape(created.isoformat())}">'
        f"{escape(created.strftime('%Y-%m-%d %H:%M'))}</td>"
        f'<td class="run-col"><a href="{escape(p.url)}">{escape(p.name or p.public_id)}</a>'
        f"{labels}</td>"
        f'<td class="num" data-sort="{escape(p.value)}">{floatformat(p.value, 2)}{spread}</td>'
        f'<td class="num">{escape(p.repeats)}</td>{versions}'
        f"<td>{'; '.join(escape(c) for c in p.changes)}</td></tr>"
    )
