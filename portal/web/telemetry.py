"""The run page's energy and cost block, and its time series per point (issue 15).

``page_part(run, results)`` is what ``templates/web/_telemetry.html`` shows:

- ``energy``: ``portal.benchmarks.energy.summarize``: per point J per output token, mean
  GPU power, GPU utilisation, cost per million output tokens and how many times fewer
  joules than the HF loop; or "not measured (no NVML)" with the runner's reason;
- ``points``: per backend and point (its first repeat), two plotly figures on one time
  axis, seconds since the point's first request: the server (requests running and
  waiting, KV-cache use, preemptions) with every request's send time marked, and the
  GPUs (power per GPU, utilisation); zoomable (drag; double-click resets); drawn by
  ``static/web/telemetry.js``.

Reads: one query and one storage read per point (``samples.telemetry``: the telemetry
objects stored beside the samples, never the per-request arrays).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from portal.benchmarks import energy, samples
from portal.benchmarks import points as pts
from portal.benchmarks.models import Run
from portal.web.figures import esc

SERVER_LINES = (
    # column, name, colour, dash, axis, scale
    ("running", "Requests running", "#2563eb", "solid", "y", 1.0),
    ("waiting", "Requests waiting", "#d97706", "dash", "y", 1.0),
    ("preemptions", "Preemptions so far", "#dc2626", "dot", "y", 1.0),
    ("kv_cache_usage", "KV cache used (%)", "#059669", "solid", "y2", 100.0),
)
GPU_COLOURS = ("#7c3aed", "#0891b2", "#db2777", "#4b5563", "#2563eb", "#d97706", "#059669")
INK, GRID = "#1b1f24", "#e5e7eb"
MAX_GPU_LINES = 8  # more GPUs than this: one line of their total power


def _shift(values: Sequence[float], origin: float) -> list[float]:
    return [round(v - origin, 3) for v in values]


def _scaled(values: Sequence[float | None], scale: float) -> list[float | None]:
    return [None if v is None else round(v * scale, 4) for v in values]


def _layout(title: str, right: str | None, span: tuple[float, float]) -> dict[str, Any]:
    lo, hi = span
    pad = max((hi - lo) * 0.05, 0.05)
    layout: dict[str, Any] = {
        # The title on its own line under the toolbar (top right), left-aligned: at a
        # phone's width the two would otherwise share the top 40 px and overlap.
        "title": {
            "text": esc(title),
            "font": {"size": 14},
            "x": 0,
            "xref": "container",
            "xanchor": "left",
            "y": 1,
            "yref": "container",
            "yanchor": "top",
            "pad": {"l": 8, "t": 34},
        },
        "margin": {"l": 56, "r": 56 if right else 16, "t": 64, "b": 44},
        "font": {"color": INK},
        "hovermode": "x unified",
        "dragmode": "zoom",
        # Below the plot, with the axis unit on the ticks (no axis title for it to run
        # into at a phone's width); the panel's text says what zero is.
        "legend": {"orientation": "h", "x": 0, "xanchor": "left", "y": -0.12, "yanchor": "top"},
        "xaxis": {
            "ticksuffix": " s",
            "range": [round(lo - pad, 3), round(hi + pad, 3)],
            "gridcolor": GRID,
            "zeroline": True,
        },
        "yaxis": {"gridcolor": GRID, "rangemode": "tozero"},
        # The requests' window: from the first one sent to the last one done.
        "shapes": [
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": lo,
                "x1": hi,
                "y0": 0,
                "y1": 1,
                "fillcolor": "#2563eb",
                "opacity": 0.06,
                "line": {"width": 0},
            }
        ],
    }
    if right:
        layout["yaxis2"] = {
            "title": {"text": right},
            "overlaying": "y",
            "side": "right",
            "range": [0, 100],
            "tickmode": "array",
            "tickvals": [0, 25, 50, 75, 100],
            "showgrid": False,
        }
    return layout


def server_figure(label: str, telemetry: Mapping[str, Any]) -> dict[str, Any] | None:
    """Requests running and waiting, KV-cache use and preemptions, request sends marked."""
    server = telemetry.get("server") or {}
    window = telemetry.get("window")
    if not server.get("t") or not window:
        return None
    origin = float(window[0])
    xs = _shift(server["t"], origin)
    data: list[dict[str, Any]] = []
    for column, name, colour, dash, axis, scale in SERVER_LINES:
        ys = server.get(column)
        if not ys or (column == "preemptions" and not any(ys)):
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": name,
                "x": xs,
                "y": _scaled(ys, scale),
                "yaxis": axis,
                "line": {"color": colour, "dash": dash, "shape": "hv", "width": 2},
                "marker": {"size": 4, "color": colour},
            }
        )
    sent = (telemetry.get("requests") or {}).get("sent") or []
    if sent:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "Request sent",
                "x": _shift(sent, origin),
                "y": [0] * len(sent),
                "marker": {
                    "symbol": "line-ns-open",
                    "size": 14,
                    "color": INK,
                    "line": {"width": 1.5},
                },
                "hoverinfo": "x+name",
            }
        )
    span = (0.0, round(float(window[1]) - origin, 3))
    layout = _layout(f"Server: {label}", "KV cache used (%)", span)
    layout["yaxis"]["title"] = {"text": "Requests"}
    return {"data": data, "layout": layout}


def gpu_figure(label: str, telemetry: Mapping[str, Any]) -> dict[str, Any] | None:
    """Power per GPU (or their total) and mean utilisation, from NVML."""
    gpu = telemetry.get("gpu") or {}
    window = telemetry.get("window")
    if not gpu.get("t") or not window:
        return None
    origin = float(window[0])
    xs = _shift(gpu["t"], origin)
    devices = gpu.get("devices") or []
    power = [c for c in gpu.get("power_w") or [] if c]
    data: list[dict[str, Any]] = []
    if len(power) > MAX_GPU_LINES:
        total = [sum(v for v in row if v is not None) for row in zip(*power, strict=True)]
        power, names = [total], [f"Power, {len(devices)} GPUs (W)"]
    else:
        names = [
            f"Power GPU {d.get('index', i)} (W)" if len(power) > 1 else "Power (W)"
            for i, d in enumerate(devices[: len(power)])
        ]
    for i, (ys, name) in enumerate(zip(power, names, strict=False)):
        colour = GPU_COLOURS[i % len(GPU_COLOURS)]
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": esc(name),
                "x": xs,
                "y": ys,
                "line": {"color": colour, "width": 2},
            }
        )
    util = [c for c in gpu.get("gpu_util") or [] if c]
    if util:
        mean = [
            round(sum(vals) / len(vals), 1) if (vals := [v for v in row if v is not None]) else None
            for row in zip(*util, strict=True)
        ]
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "GPU utilisation (%)",
                "x": xs,
                "y": mean,
                "yaxis": "y2",
                "line": {"color": "#059669", "dash": "dash", "width": 2},
            }
        )
    if not data:
        return None
    span = (0.0, round(float(window[1]) - origin, 3))
    layout = _layout(f"GPUs: {label}", "GPU utilisation (%)" if util else None, span)
    layout["yaxis"]["title"] = {"text": "Watts"}
    return {"data": data, "layout": layout}


def _note(telemetry: Mapping[str, Any]) -> str:
    """How many samples the requests' window holds, what sampling cost, and the GPUs."""
    window = telemetry.get("window") or [0.0, 0.0]
    server = telemetry.get("server") or {}
    inside = sum(1 for t in server.get("t") or [] if window[0] <= t <= window[1])
    parts = [f"{window[1] - window[0]:.2f} s from the first request to the last"]
    if server.get("t"):
        parts.append(f"{inside} /metrics samples in that time (every {server.get('interval_s')} s)")
    sampler = telemetry.get("sampler") or {}
    share = sampler.get("share_of_point_cpu")
    if isinstance(share, int | float):
        parts.append(f"sampling used {share:.1%} of the point's CPU time")
    status = str((telemetry.get("gpu") or {}).get("status") or "")
    parts.append(f"GPUs: {status}" if status and status != "ok" else "GPUs: NVML")
    return "; ".join(parts) + "."


def point_entries(
    results: pts.RunResults, telemetry: Mapping[int, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One entry per point with telemetry: its label, note and two figures."""
    out = []
    for point in results.points:
        if not point.ok or not point.ids:
            continue
        found = telemetry.get(point.ids[0]) or {}
        if not found.get("window"):
            continue
        label = f"{point.backend} · {point.short}"
        if point.repeats > 1:
            label += f" (repeat 1 of {point.repeats})"
        out.append(
            {
                "id": f"m{point.ids[0]}",
                "label": label,
                "note": _note(found),
                "server": server_figure(label, found),
                "gpu": gpu_figure(label, found),
            }
        )
    return out


def page_part(run: Run, results: pts.RunResults) -> dict[str, Any]:
    """What ``_telemetry.html`` shows (module docstring)."""
    first = [p.ids[0] for p in results.points if p.ok and p.ids]
    telemetry = samples.telemetry(first)
    entries = point_entries(results, telemetry)
    vllm = [p for p in results.points if p.ok and p.ids and p.backend_kind == "vllm"]
    best = max(vllm, key=lambda p: p.get("output_throughput") or 0.0, default=None)
    chosen = f"m{best.ids[0]}" if best else (entries[0]["id"] if entries else "")
    return {
        "energy": energy.summarize(run, results, telemetry),
        "points": entries,
        "default": chosen if any(e["id"] == chosen for e in entries) else "",
        "currency": energy.currency(),
    }
