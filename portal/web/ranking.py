"""The run page's "Ranking" section (``_run_ranking.html``): the ranking of the run's
served configurations (``portal.benchmarks.ranking``, the numbers the API and the CLI
give), a table best first with those dropped or not measured last and their reasons, why
the winner wins, its exact ``vllm serve`` command under a Copy button, and the Pareto
chart of throughput per GPU against per user over every load point.

No query of its own beyond the SLA searches' and the configuration outcomes' (the run is
loaded once: ``runview``)."""

from __future__ import annotations

from typing import Any

from portal.benchmarks import ingestion
from portal.benchmarks.ranking import Ranking, rank, spread
from portal.benchmarks.runview import LoadedRun
from portal.web.figures.common import chart, figure, layout, style, trace

FIGURE_ID = "ranking-front"
_STATE_CLASS = {"dropped": "warn", "not measured": "muted", "below range": "bad", "failed": "bad"}


def _cell(value: float | None, digits: str = ".4g", *, ranked: bool = True) -> str:
    """A number, "unknown" where the run did not measure it, "—" for a configuration
    with no point to read it at (dropped, not measured)."""
    if not ranked:
        return "—"
    return format(value, digits) if value is not None else "unknown"


def front_figure(found: Ranking) -> dict[str, Any] | None:
    """Output tok/s per GPU against per user, one trace per configuration, the Pareto
    front over all of them dotted (InferenceMAX's chart)."""
    if not found.front:
        return None
    traces = []
    order = [e.backend for e in found.entries]
    for i, backend in enumerate(order):
        mine = sorted(
            (p for p in found.front if p["backend"] == backend), key=lambda p: p["per_user"]
        )
        if not mine:
            continue
        traces.append(
            trace(
                backend,
                [p["per_user"] for p in mine],
                [p["per_gpu"] for p in mine],
                style(i),
                "%{customdata}: %{y:,.1f} tok/s per " + found.per + " at %{x:,.1f} tok/s per user",
                mode="markers",
                size=9,
                customdata=[f"{backend} {p['load']}" for p in mine],
            )
        )
    on = sorted((p for p in found.front if p["front"]), key=lambda p: p["per_user"])
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "Pareto front",
            "x": [p["per_user"] for p in on],
            "y": [p["per_gpu"] for p in on],
            "line": {"color": "#111", "dash": "dot", "width": 1.2},
            "hoverinfo": "skip",
        }
    )
    per = "GPU" if found.per == "GPU" else "server (CPU run)"
    fig_layout = layout(
        "Output tokens/s per user (1000 / median TPOT)", f"Output tokens/s per {per}"
    )
    fig_layout["xaxis"]["rangemode"] = "tozero"
    fig_layout["yaxis"]["rangemode"] = "tozero"
    note = (
        "each point a load level; per user: 1000 / median TPOT; up and to the right is "
        "better; dotted: the Pareto front"
    )
    fig = figure("Configurations: throughput per GPU against per user", traces, fig_layout, note)
    return chart(FIGURE_ID, "ranking", "front", fig)


def section(view: LoadedRun) -> dict[str, Any] | None:
    """What ``_run_ranking.html`` shows, or None for a run with fewer than two served
    configurations; ``chart`` is the Pareto chart's entry for the page's figure list."""
    spec = view.spec
    if spec is None or len(spec.served_backends) < 2:
        return None
    searches = view.sla_searches
    outcomes = ingestion.config_outcomes(view.run, spec, searches)
    found = rank(view, searches, outcomes)
    if found is None:
        return None
    rows = []
    for e in found.entries:
        limit = e.bottleneck
        shown = e.point is not None
        rows.append(
            {
                "rank": e.rank,
                "backend": e.backend,
                "overrides": ", ".join(f"{k}={v}" for k, v in e.overrides.items()),
                "state": e.state,
                "css": _STATE_CLASS.get(e.state, "") if e.rank is None else "",
                "answer": e.answer_text.split(" at ")[0] if e.answer is not None else "",
                "point": e.point.short if e.point is not None else "",
                "throughput": _cell(e.throughput, ranked=shown),
                "noise": spread(e.noise) if shown else "",
                "noise_text": e.noise.describe() if shown and e.noise else "",
                "per_gpu": _cell(e.per_gpu, ranked=shown),
                "per_user": _cell(e.per_user, ranked=shown),
                "joules": _cell(e.value("energy_per_output_token_j"), ".3g", ranked=shown),
                "cost": _cell(e.value("cost_per_million_output_tokens"), ".3g", ranked=shown),
                "limit": limit["cause"] if limit else "unknown",
                "limit_sentence": limit["sentence"] if limit else "",
                "reason": e.reason if e.rank is None else "",
            }
        )
    winner = found.winner
    return {
        "by": found.by,
        "per": found.per,
        "rows": rows,
        "why": found.why,
        "winner": winner.backend if winner else "",
        "serve": winner.serve_command if winner else "",
        "chart": front_figure(found),
    }
