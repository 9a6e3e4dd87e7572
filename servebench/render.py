"""Text output of the CLI: aligned tables for people, JSON and CSV for programs, Markdown for
pull-request comments. Pure functions of API payloads; no I/O here."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from runners import bottleneck
from runners.result import LATENCY_KEYS, THROUGHPUT_KEYS
from servebench.compare import Comparison, describe_methods, notes
from servebench.verdict import (
    BETTER,
    NO_DATA,
    NOISE,
    NOT_COMPARABLE,
    THRESHOLD,
    UNMEASURED,
    WORSE,
    MetricVerdict,
)

# Results table columns: (header, metric key).
RESULT_COLUMNS = (
    ("req/s", "request_throughput"),
    ("out tok/s", "output_throughput"),
    ("TTFT p50 ms", "median_ttft_ms"),
    ("TTFT p99 ms", "p99_ttft_ms"),
    ("TPOT p50 ms", "median_tpot_ms"),
    ("ITL p99 ms", "p99_itl_ms"),
    ("E2E p99 ms", "p99_e2el_ms"),
)
# Every metric of the result contract; p50 is vLLM's "median", so it is not repeated.
CSV_METRICS = THROUGHPUT_KEYS + tuple(k for k in LATENCY_KEYS if not k.startswith("p50_"))
MARK = {WORSE: "WORSE"}  # the one verdict that fails a build stands out in a table
EMOJI = {
    BETTER: "🟢",
    WORSE: "🔴",
    NOISE: "⚪",
    THRESHOLD: "⚪",
    UNMEASURED: "🟡",
    NO_DATA: "⚫",
    NOT_COMPARABLE: "⚫",
}


# Text from a run (its name, runner-reported names) is data in a PR comment, never
# Markdown or HTML: links, images, mentions, tables and <details> are escaped.
_MD_SPECIAL = frozenset("\\`*_{}[]()<>#+-.!|~@&")


def md(text: Any) -> str:
    """``text`` as literal Markdown text on one line."""
    flat = " ".join(str(text).split())
    return "".join(f"\\{c}" if c in _MD_SPECIAL else c for c in flat)


def md_code(text: Any) -> str:
    """``text`` as an inline code span (backticks inside cannot end it early)."""
    flat = " ".join(str(text).split()).replace("`", "'").replace("|", "\\|")
    return f"`{flat}`"


def md_url(url: Any) -> str:
    """A link target: only http(s) URLs, with nothing that could end the link."""
    text = str(url or "")
    if not text.startswith(("https://", "http://")) or any(c in text for c in " ()<>\n"):
        return ""
    return text


def number(value: Any) -> str:
    """A metric for a table: 4 significant figures, no exponent for ordinary sizes."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    v = float(value)
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def interval(v: MetricVerdict) -> str:
    """``[-3.1%, +4.0%]``; an end the data cannot bound reads ``-inf`` / ``+inf``."""
    if v.interval is None:
        return "-"
    lo, hi = (f"{x * 100:+.1f}%" if math.isfinite(x) else f"{x:+}" for x in v.interval)
    return f"[{lo}, {hi}]"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [
        all(_looks_numeric(r[i]) for r in cells[1:]) and len(cells) > 1 for i in range(len(headers))
    ]
    lines = []
    for n, row in enumerate(cells):
        parts = [
            c.rjust(widths[i]) if numeric[i] and n > 0 else c.ljust(widths[i])
            for i, c in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _looks_numeric(text: str) -> bool:
    t = text.replace(",", "").replace("%", "").lstrip("+-")
    if t in ("", "-"):
        return True
    try:
        float(t)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- runs


def progress(run: Mapping[str, Any]) -> str:
    p = run.get("progress") or {}
    return f"{p.get('done', 0)}/{p.get('total', 0)} points"


def first_error(document: Mapping[str, Any], limit: int = 300) -> str:
    """A result document's first error, one line (what made it fail or partial)."""
    for error in document.get("errors") or []:
        message = error.get("message") if isinstance(error, Mapping) else error
        if message:
            line = next((x.strip() for x in str(message).splitlines() if x.strip()), "")
            return line[:limit]
    failed = [m for m in _measurements(document) if m.get("status") != "succeeded"]
    if failed:
        return f"{len(failed)} measurement(s) failed: {str(failed[0].get('error') or '')[:limit]}"
    return "no error recorded"


def failure(run: Mapping[str, Any], limit: int = 400) -> str:
    """Why a run failed, on one line: the portal's reason, plus the first error of a
    measurement or of the runner when the reason only points at them."""
    reason = " ".join(str(run.get("failure_reason") or "no reason recorded").split())
    first = ""
    for m in run.get("measurements") or []:
        if m.get("status") == "failed" and m.get("error"):
            first = f"{m.get('backend')} {m.get('point_key')}: {m['error']}"
            break
    if not first:
        for e in run.get("errors") or []:
            if isinstance(e, dict) and e.get("message"):
                first = f"{e.get('where') or 'runner'}: {e['message']}"
                break
    first = " ".join(first.split())
    if first and first not in reason:
        reason = f"{reason}; first error: {first}"
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."


def run_status(run: Mapping[str, Any]) -> str:
    """``servebench status``: the facts a person checks, one per line."""
    rows = [
        ("run", f"{run.get('id')}  {run.get('name') or ''}".rstrip()),
        ("status", f"{run.get('status')}, {progress(run)}"),
    ]
    if run.get("failure_reason"):
        rows.append(("reason", failure(run)))
    rows += [
        ("model", run.get("model_id") or "-"),
        ("gpu", f"{run.get('gpu_name') or '-'} x{run.get('gpu_count') or 0}"),
        ("backends", ", ".join(run.get("backends") or []) or "-"),
        ("owner", run.get("owner") or "-"),
        ("created", run.get("created_at") or "-"),
        ("finished", run.get("finished_at") or "-"),
        ("fingerprint", run.get("fingerprint") or "-"),
        ("page", (run.get("links") or {}).get("page", "-")),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _measurements(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [m for m in document.get("measurements") or [] if isinstance(m, dict)]


def results_table(document: Mapping[str, Any]) -> str:
    """One row per measurement (backend, point, repeat) with the headline metrics."""
    rows = []
    failures = []
    for m in _measurements(document):
        metrics = m.get("metrics") or {}
        point = (m.get("point") or {}).get("key", "")
        rows.append(
            [
                m.get("backend", ""),
                point,
                m.get("repeat", 0),
                m.get("status", ""),
                *(number(metrics.get(key)) for _, key in RESULT_COLUMNS),
            ]
        )
        if m.get("status") != "succeeded" and m.get("error"):
            failures.append(f"{m.get('backend')} {point}: {m['error']}")
    if not rows:
        return "(no measurements yet)"
    out = table(["backend", "point", "repeat", "status", *(h for h, _ in RESULT_COLUMNS)], rows)
    if failures:
        out += "\n\nfailed:\n" + "\n".join(f"  {f}" for f in failures)
    if limits := limit_lines(document):
        out += "\n\nlimited by:\n" + "\n".join(f"  {line}" for line in limits)
    if searches := sla_lines(document):
        out += "\n\n" + "\n".join(searches)
    if ranked := ranking_lines(document):
        out += "\n\n" + "\n".join(ranked)
    return out


def _known(value: Any, digits: str = ".4g") -> str:
    return format(value, digits) if isinstance(value, int | float) else "unknown"


def _with_spread(value: Any, interval: Any) -> str:
    """'100 ±3.1%': a number and its 95% interval's half-width, where one was measured."""
    spread = interval.get("spread") if isinstance(interval, Mapping) else None
    return f"{_known(value)} {spread}" if spread else _known(value)


def ranking_lines(document: Mapping[str, Any]) -> list[str]:
    """The ranking of the run's configurations (``portal.benchmarks.ranking``): a table,
    best first, those without a result last with their reason, then why the winner wins
    and its serve command; [] without one."""
    found = document.get("ranking")
    if not isinstance(found, dict) or not found.get("entries"):
        return []
    per = found.get("per") or "GPU"
    rows = []
    for e in found["entries"]:
        if not isinstance(e, dict):
            continue
        limit = (e.get("bottleneck") or {}).get("cause") or "unknown"
        rows.append(
            [
                e.get("rank") or "-",
                e.get("backend", ""),
                e.get("state", ""),
                (e.get("answer_text") or "").split(" at ")[0] if e.get("answer") else "-",
                _with_spread(e.get("output_throughput"), e.get("output_throughput_interval")),
                _known(e.get("output_throughput_per_gpu")),
                _known(e.get("output_throughput_per_user")),
                _known(e.get("energy_per_output_token_j")),
                _known(e.get("cost_per_million_output_tokens")),
                limit if e.get("rank") else (e.get("reason") or "")[:120],
            ]
        )
    head = ["rank", "configuration", "state", "SLA answer", "tok/s", f"tok/s/{per}"]
    head += ["tok/s/user", "J/token", "$/1M tok", "limited by / why not"]
    out = [f"ranking (by {found.get('by')}):", table(head, rows)]
    if found.get("why"):
        out.append(str(found["why"]))
    winner = next((e for e in found["entries"] if e.get("rank") == 1), None)
    if winner and winner.get("serve_command"):
        out.append(f"serve the winner: {winner['serve_command']}")
    return out


def limit_lines(document: Mapping[str, Any]) -> list[str]:
    """What limited each succeeded measurement (``runners.bottleneck``), one line each:
    'vllm concurrency:max_concurrency=8 #0: scheduler-queue. The scheduler ran ...'."""
    out = []
    for m in _measurements(document):
        if m.get("status") != "succeeded":
            continue  # the failed list above says why
        limit = bottleneck.diagnose(m)
        point = (m.get("point") or {}).get("key", "")
        out.append(
            f"{m.get('backend', '')} {point} #{m.get('repeat', 0)}: {limit.cause}. {limit.sentence}"
        )
    return out


def sla_lines(document: Mapping[str, Any]) -> list[str]:
    """One line per SLA search of the result document (``runners.sla.summarize``):
    'SLA search on prod: 12.5 req/s at p99 TTFT <= 500 ms (converged, 6 of 8 points;
    path 1 missed, 1 again met, 64 missed, 8 met, ...)'."""
    out = []
    for s in document.get("sla_searches") or []:
        if not isinstance(s, dict):
            continue
        path = ", ".join(
            f"{step['value']:g}{' again' if step.get('repeat') == 1 else ''} "
            f"{'met' if step.get('passed') else 'missed'}"
            for step in s.get("path") or []
            if isinstance(step, dict) and isinstance(step.get("value"), int | float)
        )
        out.append(
            f"SLA search on {s.get('backend')}: {s.get('text')} ({s.get('state')}, "
            f"{s.get('points_used')} of {s.get('max_points')} points"
            + (f"; path {path}" if path else "")
            + ")"
        )
    return out


def results_csv(document: Mapping[str, Any]) -> str:
    """One row per measurement: the point's workload and every vLLM metric key."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    head = ["backend", "backend_kind", "point", "sweep", "axis", "value", "repeat", "status"]
    head += ["input_len", "output_len", "max_concurrency", "num_prompts", "request_rate"]
    writer.writerow([*head, *CSV_METRICS, "error"])
    for m in _measurements(document):
        p = m.get("point") or {}
        metrics = m.get("metrics") or {}
        writer.writerow(
            [
                m.get("backend"),
                m.get("backend_kind"),
                p.get("key"),
                p.get("sweep"),
                p.get("axis") or "",
                _cell(p.get("value")),
                m.get("repeat"),
                m.get("status"),
                p.get("input_len"),
                p.get("output_len"),
                p.get("max_concurrency"),
                p.get("num_prompts"),
                _cell(p.get("request_rate")),
                *(_cell(metrics.get(k)) for k in CSV_METRICS),
                m.get("error") or "",
            ]
        )
    return buf.getvalue()


def _cell(value: Any) -> str:
    return "" if value is None else repr(value) if isinstance(value, float) else str(value)


def results_markdown(run: Mapping[str, Any], document: Mapping[str, Any]) -> str:
    """A run's results as a PR comment (no baseline to compare with)."""
    page = (run.get("links") or {}).get("page", "")
    lines = [
        f"### servebench: [{md(run.get('name') or run.get('id'))}]({md_url(page)}) "
        f"{md(run.get('status'))}",
        "",
        "| backend | point | " + " | ".join(h for h, _ in RESULT_COLUMNS) + " |",
        "|---|---|" + "---:|" * len(RESULT_COLUMNS),
    ]
    for m in _measurements(document):
        metrics = m.get("metrics") or {}
        cells = " | ".join(number(metrics.get(k)) for _, k in RESULT_COLUMNS)
        point = md_code((m.get("point") or {}).get("key"))
        lines.append(f"| {md(m.get('backend'))} | {point} | {cells} |")
    searches = sla_lines(document)
    if searches:
        lines += ["", *(f"- {md(line)}" for line in searches)]
    found = document.get("ranking")
    if isinstance(found, dict) and found.get("winner"):
        lines += ["", f"**Best configuration: {md(found['winner'])}**. {md(found.get('why'))}"]
    return "\n".join(lines) + "\n"


def presets_table(presets: Sequence[Mapping[str, Any]]) -> str:
    rows = [[p.get("name"), p.get("title"), p.get("description")] for p in presets]
    return table(["name", "title", "description"], rows)


# --------------------------------------------------------------------------- comparisons


def _run_ref(run: Mapping[str, Any]) -> str:
    return f"{run.get('id')} ({run.get('name') or run.get('model_id') or ''})"


def verdict_summary(comparison: Comparison) -> str:
    counts = comparison.counts()
    if not comparison.comparable:
        shown = "; ".join(comparison.differences[:3]) or "their fingerprints differ"
        more = len(comparison.differences) - 3
        return f"not comparable ({shown}{f'; and {more} more' if more > 0 else ''})"
    if comparison.regressed:
        head = f"{counts[WORSE]} regression{'s' if counts[WORSE] != 1 else ''}"
    else:
        head = "no regression"
    order = (BETTER, UNMEASURED, NOISE, THRESHOLD, NO_DATA)
    rest = [f"{counts[v]} {v}" for v in order if counts[v]]
    return head + (f" ({', '.join(rest)})" if rest else "")


def comparison_table(
    comparison: Comparison, base: Mapping[str, Any], candidate: Mapping[str, Any]
) -> str:
    """A table per point: base, candidate, change, interval, method, verdict; then why."""
    conf = f"{comparison.confidence * 100:g}%"
    out = [
        f"base       {_run_ref(base)}  {(base.get('links') or {}).get('page', '')}",
        f"candidate  {_run_ref(candidate)}  {(candidate.get('links') or {}).get('page', '')}",
        f"threshold  {_thresholds(comparison)}; interval {conf}; a regression is worse than "
        "the threshold and beyond the run-to-run noise (repeats or the series' history)",
    ]
    if not comparison.comparable:
        out.append(
            "NOT COMPARABLE: the runs measured different things (workload or hardware); "
            "no change is judged. Differs:"
        )
        out += [f"  {d}" for d in comparison.differences or ["the fingerprint"]]
    else:
        out.append(f"what changed  {changes_text(comparison)}")
    if comparison.quality_note:
        out.append(f"note: {comparison.quality_note}")
    if comparison.is_contended:
        out.append(f"CONTENDED: {comparison.contention_text()}")
    for p in comparison.points:
        out += ["", f"{p.label}  (repeats: {p.base_repeats} vs {p.candidate_repeats})"]
        rows = [
            [
                v.metric,
                number(v.base),
                number(v.candidate),
                pct(v.change),
                interval(v),
                v.method,
                MARK.get(v.verdict, v.verdict),
            ]
            for v in p.verdicts
        ]
        body = table(
            ["metric", "base", "candidate", "change", f"{conf} interval", "method", "verdict"],
            rows,
        )
        out += ["  " + line for line in body.splitlines()]
    if not comparison.points:
        out += ["", "no point was measured by both runs: nothing to compare"]
    for label in comparison.only_base:
        out.append(f"only in base: {label}")
    for label in comparison.only_candidate:
        out.append(f"only in candidate: {label}")
    out += ["", f"verdict: {verdict_summary(comparison)}{contended_suffix(comparison)}"]
    for p, v in comparison.regressions:
        out.append(
            f"  WORSE {p.label} {v.metric}: {pct(v.change)} {interval(v)} "
            f"({'higher' if v.better == 'higher' else 'lower'} is better)"
        )
    methods = describe_methods(comparison)
    if methods:
        out += ["methods:"] + [f"  {m}" for m in methods]
    for note in notes(comparison):
        out.append(f"note: {note}")
    return "\n".join(out) + "\n"


def changes_text(comparison: Comparison) -> str:
    """'vllm.max_num_seqs: default → 1; vLLM: 0.32.0 → 0.33.1', or 'nothing (...)'."""
    if comparison.changes:
        return "; ".join(comparison.changes)
    return "nothing in the configuration or software (a re-run: any change is noise)"


def changes_markdown(comparison: Comparison) -> str:
    """Each change as code (a flag's name reads as typed, underscores and all)."""
    if comparison.changes:
        return "; ".join(md_code(c) for c in comparison.changes)
    return md(changes_text(comparison))


def contended_suffix(comparison: Comparison) -> str:
    return " (measured under CPU contention: see above)" if comparison.is_contended else ""


def headline_icon(comparison: Comparison) -> str:
    """🔴 a regression, ⚫ not comparable, 🟡 changes whose noise was not measured, 🟢 else."""
    if comparison.regressed:
        return EMOJI[WORSE]
    if not comparison.comparable:
        return EMOJI[NOT_COMPARABLE]
    return EMOJI[UNMEASURED] if comparison.counts()[UNMEASURED] else EMOJI[BETTER]


def _thresholds(comparison: Comparison) -> str:
    text = f"{comparison.threshold * 100:g}%"
    extra = [f"{k} {v * 100:g}%" for k, v in comparison.thresholds.items()]
    return text + (f" ({', '.join(extra)})" if extra else "")


def comparison_markdown(
    comparison: Comparison,
    base: Mapping[str, Any],
    candidate: Mapping[str, Any],
    compare_url: str = "",
) -> str:
    """A pull-request comment: the verdict first, one table, the method in a fold."""
    icon = headline_icon(comparison)
    conf = f"{comparison.confidence * 100:g}%"
    bpage = (base.get("links") or {}).get("page", "")
    cpage = (candidate.get("links") or {}).get("page", "")
    lines = [
        f"### {icon} servebench: {verdict_summary(comparison)}{contended_suffix(comparison)}",
        "",
        *(
            [f"**What changed:** {changes_markdown(comparison)}", ""]
            if comparison.comparable
            else []
        ),
        *([f"> ⚠️ {md(comparison.contention_text())}", ""] if comparison.is_contended else []),
        *([f"> {md(comparison.quality_note)}", ""] if comparison.quality_note else []),
        f"Candidate [{md(_run_ref(candidate))}]({md_url(cpage)}) against base "
        f"[{md(_run_ref(base))}]({md_url(bpage)})"
        + (f" · [compare page]({md_url(compare_url)})" if md_url(compare_url) else ""),
        "",
        f"A regression is a change worse than the threshold ({_thresholds(comparison)}) "
        f"whose {conf} interval of the run-to-run noise (repeats, or the series' history) "
        "excludes zero.",
        "",
        *(
            ["**Not comparable**, the runs measured different things:", ""]
            + [f"- {md_code(d)}" for d in comparison.differences]
            + [""]
            if not comparison.comparable
            else []
        ),
        f"| point | metric | base | candidate | change | {conf} interval | verdict |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for p in comparison.points:
        for v in p.verdicts:
            lines.append(
                f"| {md_code(p.label)} | {md(v.metric)} | {number(v.base)} | "
                f"{number(v.candidate)} | "
                f"{pct(v.change)} | {interval(v)} | {EMOJI.get(v.verdict, '')} {v.verdict} |"
            )
    if not comparison.points:
        lines.append("| - | no point measured by both runs | | | | | |")
    extra = [f"only in base: {md_code(x)}" for x in comparison.only_base]
    extra += [f"only in candidate: {md_code(x)}" for x in comparison.only_candidate]
    if extra:
        lines += ["", *(f"- {x}" for x in extra)]
    lines += ["", "<details><summary>How the verdict was computed</summary>", ""]
    lines += [f"- {m}" for m in describe_methods(comparison)]
    lines += [f"- note: {n}" for n in notes(comparison)]
    lines += [
        f"- bootstrap resamples: {comparison.n_boot}, seed {comparison.seed} (reproducible)",
        "",
        "</details>",
    ]
    return "\n".join(lines) + "\n"


def comparison_json(
    comparison: Comparison,
    base: Mapping[str, Any],
    candidate: Mapping[str, Any],
    compare_url: str = "",
) -> str:
    body = {
        "base": {k: base.get(k) for k in ("id", "name", "fingerprint", "links")},
        "candidate": {k: candidate.get(k) for k in ("id", "name", "fingerprint", "links")},
        "compare_url": compare_url,
        **comparison.as_dict(),
    }
    return json.dumps(body, indent=2) + "\n"
