"""Plotly figure specs (plain dicts) built from a run's measurements.

Pages embed these with ``json_script`` and draw them with the locally served plotly.js,
so the figure logic lives here, testable without a browser, and templates stay dumb.

Input rows are plain mappings with: backend, backend_kind, sweep, axis, value, repeat,
status and metrics (vLLM's key names). Repeats of one point are averaged; their standard
deviation becomes the error bar.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

AXIS_TITLES = {
    "max_concurrency": "Concurrency (requests in flight)",
    "input_len": "Prompt length (tokens)",
    "output_len": "Output length (tokens)",
    "request_rate": "Request rate (req/s)",
    "num_prompts": "Number of prompts",
}
PALETTE = ["#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"]
HF_COLOR = "#6b7280"


@dataclass
class SeriesPoint:
    x: float
    mean: dict[str, float] = field(default_factory=dict)
    std: dict[str, float] = field(default_factory=dict)
    repeats: int = 0


@dataclass
class Series:
    """One backend along one sweep: points sorted by the swept value."""

    backend: str
    sweep: str
    axis: str
    points: list[SeriesPoint]

    def xs(self) -> list[float]:
        return [p.x for p in self.points]

    def ys(self, key: str) -> list[float | None]:
        return [p.mean.get(key) for p in self.points]

    def errs(self, key: str) -> list[float]:
        return [p.std.get(key, 0.0) for p in self.points]


def _aggregate(rows: list[Mapping[str, Any]]) -> tuple[dict[str, float], dict[str, float]]:
    keys: set[str] = set()
    for row in rows:
        keys.update(k for k, v in row["metrics"].items() if isinstance(v, int | float))
    mean, std = {}, {}
    for key in keys:
        values = [float(r["metrics"][key]) for r in rows if key in r["metrics"]]
        if values:
            mean[key] = statistics.fmean(values)
            std[key] = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, std


def build_series(rows: Iterable[Mapping[str, Any]]) -> tuple[list[Series], dict[str, Any]]:
    """Group succeeded vLLM rows into series per (sweep, backend); average HF baselines.

    Returns (series, baselines) where baselines maps an HF backend name to its averaged
    metrics (the reference line on throughput charts).
    """
    by_point: dict[tuple[str, str, str, float], list[Mapping[str, Any]]] = defaultdict(list)
    hf_rows: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["status"] != "succeeded" or not row["metrics"]:
            continue
        if row["backend_kind"] == "hf-sequential":
            hf_rows[row["backend"]].append(row)
        elif row["axis"] is not None and row["value"] is not None:
            by_point[(row["sweep"], row["axis"], row["backend"], float(row["value"]))].append(row)
        else:
            by_point[(row["sweep"], "max_concurrency", row["backend"], 1.0)].append(row)

    grouped: dict[tuple[str, str, str], list[SeriesPoint]] = defaultdict(list)
    for (sweep, axis, backend, x), point_rows in by_point.items():
        mean, std = _aggregate(point_rows)
        grouped[(sweep, axis, backend)].append(SeriesPoint(x, mean, std, len(point_rows)))
    series = [
        Series(backend, sweep, axis, sorted(points, key=lambda p: p.x))
        for (sweep, axis, backend), points in grouped.items()
    ]
    series.sort(key=lambda s: (s.sweep, s.backend))
    baselines = {name: _aggregate(hf)[0] for name, hf in hf_rows.items()}
    return series, baselines


def _layout(title: str, xtitle: str, ytitle: str, log_x: bool) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 15}},
        "xaxis": {"title": {"text": xtitle}, "type": "log" if log_x else "linear"},
        "yaxis": {"title": {"text": ytitle}, "rangemode": "tozero"},
        "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
        "legend": {"orientation": "h", "y": -0.2},
        "hovermode": "x unified",
        "template": "plotly_white",
    }


def _log_x(xs: list[float]) -> bool:
    return len(xs) > 2 and min(xs) > 0 and max(xs) / min(xs) >= 16


def throughput_figure(
    sweep: str, series: list[Series], baselines: dict[str, Any], metric: str = "output_throughput"
) -> dict[str, Any]:
    """Throughput against the swept axis, HF baseline as a reference line, speedup labelled."""
    mine = [s for s in series if s.sweep == sweep]
    axis = mine[0].axis if mine else "max_concurrency"
    traces: list[dict[str, Any]] = []
    all_x = sorted({x for s in mine for x in s.xs()})
    for i, s in enumerate(mine):
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": s.backend,
                "x": s.xs(),
                "y": s.ys(metric),
                "error_y": {"type": "data", "array": s.errs(metric), "visible": True},
                "line": {"color": PALETTE[i % len(PALETTE)]},
                "hovertemplate": "%{y:.1f} tok/s<extra>" + s.backend + "</extra>",
            }
        )
    annotations = []
    for name, base in baselines.items():
        ref = base.get(metric)
        if not ref or not all_x:
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"{name} (baseline)",
                "x": [all_x[0], all_x[-1]],
                "y": [ref, ref],
                "line": {"color": HF_COLOR, "dash": "dash"},
                "hovertemplate": "%{y:.1f} tok/s<extra>" + name + "</extra>",
            }
        )
        for s in mine:
            for x, y in zip(s.xs(), s.ys(metric), strict=True):
                if y:
                    annotations.append(
                        {
                            "x": x,
                            "y": y,
                            "text": f"{y / ref:.1f}x",
                            "showarrow": False,
                            "yshift": 14,
                            "font": {"size": 11, "color": "#374151"},
                        }
                    )
    title = {
        "output_throughput": "Output tokens/s",
        "total_token_throughput": "Total tokens/s",
        "request_throughput": "Requests/s",
    }[metric]
    layout = _layout(f"{title} ({sweep})", AXIS_TITLES.get(axis, axis), title, _log_x(all_x))
    layout["annotations"] = annotations
    return {"data": traces, "layout": layout}


def latency_figure(sweep: str, series: list[Series], metric: str = "ttft") -> dict[str, Any]:
    """p50 / p90 / p99 of one latency metric against the swept axis."""
    mine = [s for s in series if s.sweep == sweep]
    axis = mine[0].axis if mine else "max_concurrency"
    traces = []
    dashes = {"p50": "solid", "p90": "dash", "p99": "dot"}
    for i, s in enumerate(mine):
        for stat, dash in dashes.items():
            key = f"{stat}_{metric}_ms"
            if stat == "p50" and all(v is None for v in s.ys(key)):
                key = f"median_{metric}_ms"
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": f"{s.backend} {stat}",
                    "x": s.xs(),
                    "y": s.ys(key),
                    "line": {"color": PALETTE[i % len(PALETTE)], "dash": dash},
                    "hovertemplate": "%{y:.1f} ms<extra>" + f"{s.backend} {stat}</extra>",
                }
            )
    name = {
        "ttft": "Time to first token",
        "tpot": "Time per output token",
        "itl": "Inter-token latency",
        "e2el": "End-to-end latency",
    }[metric]
    all_x = sorted({x for s in mine for x in s.xs()})
    return {
        "data": traces,
        "layout": _layout(f"{name} ({sweep})", AXIS_TITLES.get(axis, axis), "ms", _log_x(all_x)),
    }


def run_figures(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every chart of a run page, in display order: [{id, title, figure}]."""
    series, baselines = build_series(rows)
    figures = []
    for sweep in dict.fromkeys(s.sweep for s in series):
        figures.append(
            {"id": f"{sweep}-output", "figure": throughput_figure(sweep, series, baselines)}
        )
        figures.append({"id": f"{sweep}-ttft", "figure": latency_figure(sweep, series, "ttft")})
        figures.append({"id": f"{sweep}-tpot", "figure": latency_figure(sweep, series, "tpot")})
    return figures
