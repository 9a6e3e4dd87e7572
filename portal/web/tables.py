"""The run page's summary table (one row per backend and point, every metric) and its
CSV / JSON downloads, built from ``portal.benchmarks.points.RunResults``; the compare
page's metric table.

Cells carry the raw number (``data-sort`` for the sortable table) and the text shown
(in the catalogue's unit: % for fractions, GiB for bytes), with "± std" when the point
had several repeats. The summary shows ``KEY_METRICS`` first; the other columns carry
``extra`` and show on demand. A header names its unit once ("Output tok/s", "TTFT p99
ms"), never twice.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from html import escape
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from portal.benchmarks.points import METRICS, Metric, PointStats, RunResults, display_value
from runners import spec as rs


@dataclass
class Cell:
    sort: float | None
    text: str
    spread: str = ""
    spread_title: str = ""  # how the spread was measured, for the cell's title
    extra: bool = False  # shown on demand (not one of KEY_METRICS)


# What a reader checks first, in this order; the rest of the catalogue is one click away.
KEY_METRICS = (
    "output_throughput",
    "request_throughput",
    "request_goodput",
    "slo_attainment",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "p99_e2el_ms",
    "preemptions",
)


@dataclass(frozen=True)
class Heading:
    """A summary column: its metric, the header text and unit, and whether it is shown
    before the reader asks for every column."""

    metric: Metric
    label: str
    unit: str
    extra: bool

    @property
    def key(self) -> str:
        return self.metric.key


def heading(metric: Metric) -> tuple[str, str]:
    """(label, unit) for a header: the unit is left out where the label already says it
    ("Output tok/s", "Requests/s"), so no header reads "Output tok/s tok/s"."""
    unit = metric.unit
    if unit and ("/s" in metric.label or unit in metric.label.split()):
        unit = ""
    return metric.label, unit


def summary_headings(results: RunResults) -> list[Heading]:
    """The metrics some point has: ``KEY_METRICS`` first (preemptions only when a point
    had some), then the rest of the catalogue, in its order, as ``extra``."""
    present = columns(results)
    preempted = any((p.get("preemptions") or 0) > 0 for p in results.points)
    primary = [
        m for key in KEY_METRICS for m in present
        if m.key == key and (key != "preemptions" or preempted)
    ]  # fmt: skip
    rest = [m for m in present if m not in primary]
    return [Heading(m, *heading(m), extra=False) for m in primary] + [
        Heading(m, *heading(m), extra=True) for m in rest
    ]


@dataclass
class SummaryRow:
    point: PointStats
    cells: list[Cell]
    speedup: float | None

    @property
    def preempted(self) -> bool:
        return (self.point.get("preemptions") or 0) > 0


def columns(results: RunResults) -> list[Metric]:
    """The catalogue's metrics that at least one point has, in catalogue order."""
    present = {key for p in results.points for key in p.mean}
    return [m for m in METRICS if m.key in present]


def format_value(metric: Metric, value: float | None) -> str:
    shown = display_value(metric.key, value)
    if shown is None:
        return "—"
    return f"{shown:,.{metric.digits}f}"


def summary_rows(results: RunResults, headings: list[Heading]) -> list[SummaryRow]:
    rows = []
    for p in results.points:
        cells = []
        for head in headings:
            metric = head.metric
            value = p.get(metric.key)
            spread, title = "", ""
            requests = p.requests.get(metric.key) if p.repeats == 1 else None
            if p.repeats > 1 and value is not None and p.std.get(metric.key):
                spread = "± " + format_value(metric, p.std[metric.key]).lstrip("-")
                title = f"standard deviation over {p.repeats} repeats"
            elif requests is not None:
                # One repeat: the request-level 95% interval, as a share of the value.
                rel = requests.relative
                spread = "±∞" if math.isinf(rel) else f"±{rel * 100:.1f}%"
                title = requests.describe() + "; it cannot see run-to-run noise"
            shown = display_value(metric.key, value)
            text = format_value(metric, value)
            cells.append(Cell(shown, text, spread, title, head.extra))
        rows.append(SummaryRow(p, cells, results.speedup(p)))
    return rows


RECORD_FIELDS = (
    "backend",
    "backend_kind",
    "point",
    "sweep",
    "axis",
    "value",
    "input_len",
    "output_len",
    "concurrency",
    "num_prompts",
    "repeats",
    "failed",
    "speedup_vs_hf",
    "speedup_reference",
    "limited_by",
    "limited_by_evidence",
)


def records(results: RunResults) -> list[dict[str, Any]]:
    """One dict per point: identity, then each metric's mean and standard deviation
    (``<key>`` and ``<key>_std``) in stored units (fractions, bytes, ms)."""
    metrics = columns(results)
    reference = results.reference_name
    out = []
    for p in results.points:
        record: dict[str, Any] = {
            "backend": p.backend,
            "backend_kind": p.backend_kind,
            "point": p.point_key,
            "sweep": p.sweep,
            "axis": p.axis,
            "value": rs.whole_numbers(p.value),  # concurrency 4, not 4.0
            "input_len": p.input_len,
            "output_len": p.output_len,
            "concurrency": p.concurrency,
            "num_prompts": p.num_prompts,
            "repeats": p.repeats,
            "failed": p.failed,
            "speedup_vs_hf": results.speedup(p),
            # which backend speedup_vs_hf is over (hf-sequential when the run has one)
            "speedup_reference": reference,
            # what limited the point (runners.bottleneck) and the sentence with its evidence
            "limited_by": limit.cause if (limit := p.bottleneck) else None,
            "limited_by_evidence": limit.sentence if limit else None,
        }
        for metric in metrics:
            record[metric.key] = p.get(metric.key)
            # A standard deviation needs two repeats: measured once, it is unknown (empty),
            # never a 0.0 that reads as "no spread".
            record[f"{metric.key}_std"] = p.std.get(metric.key) if p.repeats > 1 else None
        out.append(record)
    return out


def as_csv(results: RunResults) -> str:
    metrics = columns(results)
    header = [*RECORD_FIELDS]
    for metric in metrics:
        header += [metric.key, f"{metric.key}_std"]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    for record in records(results):
        writer.writerow({k: ("" if v is None else _csv_safe(v)) for k, v in record.items()})
    return buffer.getvalue()


def _csv_safe(value: Any) -> Any:
    """Text that a spreadsheet would run as a formula gets a leading quote."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return value


@dataclass
class CompareCell:
    text: str
    delta: float | None
    verdict: str  # the colour: "better", "worse" or ""
    word: str = ""  # the verdict engine's word ("within noise"...), "" where not judged
    judged: str = ""  # the word and why, for the cell's title


def _judged(judgement: Any) -> str:
    """``worse: -12.3%, 95% interval -20.1% to -4.5% (repeats + bootstrap)``."""
    if judgement is None:
        return ""
    text = judgement.verdict
    if judgement.interval is not None:
        lo, hi = (
            _signed_pct(x) if math.isfinite(x) else ("-inf" if x < 0 else "+inf")
            for x in judgement.interval
        )
        text += f", {judgement.confidence:.0%} interval {lo} to {hi}"
    if judgement.method not in ("", "-"):
        text += f" ({judgement.method})"
    return text


@dataclass
class CompareLine:
    row: Any  # portal.benchmarks.compare.MetricRow
    cells: list[CompareCell]


def compare_lines(rows: list[Any]) -> list[CompareLine]:
    """The compare table's cells: value in the metric's unit, relative difference to the
    baseline, and the verdict engine's judgement (coloured only when worse or better)."""
    return [
        CompareLine(
            row,
            [
                CompareCell(
                    format_value(row.metric, value),
                    delta,
                    verdict,
                    judgement.verdict if judgement is not None else "",
                    _judged(judgement),
                )
                for value, delta, verdict, judgement in zip(
                    row.values, row.deltas, row.verdicts, row.judgements, strict=True
                )
            ],
        )
        for row in rows
    ]


def _signed_pct(value: float) -> str:
    return f"{value * 100:+.1f}%"


def column_order(count: int, baseline: int) -> list[int]:
    """The compare table's run columns: the baseline first (always on screen), then the
    others in the order chosen."""
    return [baseline, *(i for i in range(count) if i != baseline)]


def compare_tbody(lines: list[CompareLine], order: list[int] | None = None) -> SafeString:
    """The compare table's body as HTML, built here rather than in the template: 8 runs x
    20 points x 30 metrics is ~5,000 cells, ten times faster to join than to render
    through template tags. One ``<tbody>`` per point, headed by the point's name, one row
    per metric; run columns in ``order`` (``column_order``: the baseline first). A cell
    the engine calls worse or better is coloured and says so in words; every judged cell
    has the verdict, interval and method in its title. Every piece of text is escaped."""
    out: list[str] = []
    current: tuple[str, str] | None = None
    width = 1 + (len(order) if order is not None else len(lines[0].cells) if lines else 0)
    for line in lines:
        row = line.row
        point = (row.point.backend, row.point.point_key)
        if point != current:
            if current is not None:
                out.append("</tbody>")
            current = point
            out.append(
                f'<tbody data-point="{escape(row.point.point_key)}"><tr class="group">'
                f'<th colspan="{width}" scope="rowgroup">{escape(row.point.backend)} · '
                f"{escape(row.point.short)}</th></tr>"
            )
        label, unit_text = heading(row.metric)
        unit = f' <span class="unit">{escape(unit_text)}</span>' if unit_text else ""
        cells = [line.cells[i] for i in order] if order is not None else line.cells
        body = "".join(
            _compare_cell(cell, n == 0 and order is not None) for n, cell in enumerate(cells)
        )
        out.append(
            f'<tr data-metric="{escape(row.metric.key)}">'
            f'<th scope="row">{escape(label)}{unit}</th>{body}</tr>'
        )
    if current is not None:
        out.append("</tbody>")
    return mark_safe("\n".join(out))  # noqa: S308 - built from escaped parts above


def _compare_cell(cell: CompareCell, is_baseline: bool) -> str:
    classes = " ".join(c for c in ("num", cell.verdict, "base" if is_baseline else "") if c)
    attrs = (
        f' data-verdict="{escape(cell.word)}" title="{escape(cell.judged)}"' if cell.judged else ""
    )
    delta = (
        f' <span class="delta">{_signed_pct(cell.delta)}</span>' if cell.delta is not None else ""
    )
    word = f' <span class="verdict">{escape(cell.word)}</span>' if cell.verdict else ""
    return f'<td class="{classes}"{attrs}>{escape(cell.text)}{delta}{word}</td>'
