"""Energy and cost per point: joules per output token, mean power, GPU utilisation, and
what a million output tokens cost at a GPU-hour price.

The runner measures (``runners.telemetry``: NVML's energy counter over the requests'
window); the portal prices. At ingestion (``apply``) the derived metrics are recomputed
with the one rule (``runners.telemetry.derive``) and the price that applies
(``price_for``): the spec's ``resources.gpu_hour_price``, else the admin's default for
the run's GPU type (``SERVEBENCH_GPU_HOUR_PRICES``). They are stored with the client's
metrics, so the run page, compare, history, the API, the result document and
``servebench compare --metric energy_per_output_token_j`` all read the same numbers. The
price used is kept in the measurement's telemetry (``price``), so a page can say which
one it was; a later change of the default does not reprice stored runs.

Where a run's GPUs could not be read (no NVIDIA GPU, no driver, no ``nvidia-ml-py``) the
figures are absent and pages say ``NOT_MEASURED`` with the runner's reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from portal.benchmarks import points as pts
from portal.benchmarks.models import Run
from runners import result as rr
from runners import roofline
from runners import telemetry as tm

NOT_MEASURED = tm.NOT_MEASURED
ENERGY_KEY = "energy_per_output_token_j"
COST_KEY = "cost_per_million_output_tokens"


@dataclass(frozen=True)
class Price:
    per_gpu_hour: float
    currency: str
    source: str  # "the spec (resources.gpu_hour_price)", "the portal's price for H100-SXM"

    def as_dict(self) -> dict[str, Any]:
        return {"per_gpu_hour": self.per_gpu_hour, "currency": self.currency, "source": self.source}


def currency() -> str:
    """The currency prices are in (``SERVEBENCH_PRICE_CURRENCY``), as pages print it."""
    return settings.SERVEBENCH_PRICE_CURRENCY


def _key(name: str) -> str:
    return roofline.normalise(name).replace(" ", "")


def price_for(spec: Mapping[str, Any], gpu_names: Iterable[str]) -> Price | None:
    """The GPU-hour price of a run: its spec's, else the admin's default for the first of
    ``gpu_names`` (the spec's gpu_type, the GPU NVML or the environment named) that the
    price table names, directly or through servebench's GPU table key."""
    currency = settings.SERVEBENCH_PRICE_CURRENCY
    resources = spec.get("resources") if isinstance(spec.get("resources"), Mapping) else {}
    own = resources.get("gpu_hour_price")
    if isinstance(own, int | float) and not isinstance(own, bool):
        return Price(float(own), currency, "the spec (resources.gpu_hour_price)")
    table = {_key(k): (k, v) for k, v in settings.SERVEBENCH_GPU_HOUR_PRICES.items()}
    for name in gpu_names:
        if not name:
            continue
        gpu = roofline.lookup_gpu(name)
        for candidate in (name, gpu.key if gpu else ""):
            found = table.get(_key(candidate)) if candidate else None
            if found is not None:
                return Price(found[1], currency, f"the portal's price for {found[0]}")
    return None


def _names(run: Run, telemetry: Mapping[str, Any]) -> list[str]:
    gpu = telemetry.get("gpu") if isinstance(telemetry.get("gpu"), Mapping) else {}
    devices = [d.get("name", "") for d in gpu.get("devices") or [] if isinstance(d, Mapping)]
    resources = run.spec.get("resources") or {}
    return [str(resources.get("gpu_type") or ""), *devices, run.gpu_name]


def apply(run: Run, m: rr.Measurement) -> rr.Measurement:
    """The measurement with its derived metrics recomputed here (the runner's own are
    replaced: the portal prices), and the price used recorded in its telemetry."""
    if m.status != "succeeded" or not m.metrics or m.backend_kind == "endpoint":
        return m
    price = price_for(run.spec, _names(run, m.telemetry))
    gpus = tm.gpu_count(m.telemetry) or (run.gpu_count or None)
    derived = tm.derive(
        m.telemetry,
        m.metrics,
        price_per_gpu_hour=price.per_gpu_hour if price else None,
        gpus=gpus,
    )
    metrics = {k: v for k, v in m.metrics.items() if k not in tm.DERIVED_KEYS} | derived
    telemetry = dict(m.telemetry)
    if telemetry and price is not None:
        telemetry["price"] = price.as_dict()
    return m.model_copy(update={"metrics": metrics, "telemetry": telemetry})


# --------------------------------------------------------------------------- pages


@dataclass
class EnergyRow:
    """One point's figures (means over its repeats) and how it stands against HF."""

    point: pts.PointStats
    values: dict[str, float]
    fewer_joules_than_hf: float | None = None


@dataclass
class EnergySummary:
    """What the run page's energy and cost block says."""

    rows: list[EnergyRow] = field(default_factory=list)
    measured: bool = False  # some point has energy figures
    priced: bool = False  # some point has a cost
    reason: str = ""  # why not measured (the runner's words), when nothing was
    headline: str = ""  # "vLLM at concurrency 64 used 9.0x fewer joules per output token..."
    price: dict[str, Any] | None = None
    unpriced: str = ""  # why there is no cost although energy was measured

    @property
    def not_measured(self) -> str:
        return f"{NOT_MEASURED}: {self.reason}" if self.reason else NOT_MEASURED


def _values(point: pts.PointStats) -> dict[str, float]:
    return {k: point.mean[k] for k in tm.DERIVED_KEYS if point.mean.get(k) is not None}


def _loop(reference: pts.PointStats | None) -> str:
    if reference is None or reference.backend_kind == "hf-sequential":
        return "the HF loop"
    return f"the {reference.backend} baseline"


def summarize(
    run: Run, results: pts.RunResults, telemetry: Mapping[int, Mapping[str, Any]]
) -> EnergySummary:
    """The run page's block from its points and their telemetry (``samples.telemetry``:
    the runner's reason when NVML was not readable, the price used)."""
    out = EnergySummary()
    hf = results.reference  # the one reference rule (points.RunResults.reference)
    hf_j = hf.get(ENERGY_KEY) if hf else None
    for point in results.points:
        if not point.ok or point.backend_kind == "endpoint":
            continue
        values = _values(point)
        row = EnergyRow(point, values)
        if hf_j and values.get(ENERGY_KEY) and point is not hf:
            row.fewer_joules_than_hf = hf_j / values[ENERGY_KEY]
        out.rows.append(row)
    out.measured = any(ENERGY_KEY in r.values for r in out.rows)
    out.priced = any(COST_KEY in r.values for r in out.rows)
    stored = [t for t in telemetry.values() if t]
    statuses = [str((t.get("gpu") or {}).get("status") or "") for t in stored]
    reasons = [s.split(": ", 1)[1] for s in statuses if s.startswith(NOT_MEASURED + ": ")]
    if not out.measured:
        out.reason = reasons[0] if reasons else "the runner sent no GPU telemetry"
    out.price = next((t["price"] for t in stored if isinstance(t.get("price"), dict)), None)
    if out.measured and not out.priced:
        gpu = run.gpu_name or "this GPU"
        out.unpriced = (
            f"no GPU-hour price for {gpu}: set resources.gpu_hour_price in the spec, or ask "
            "the admin to add it to SERVEBENCH_GPU_HOUR_PRICES"
        )
    best = max(
        (r for r in out.rows if r.fewer_joules_than_hf),
        key=lambda r: r.fewer_joules_than_hf or 0.0,
        default=None,
    )
    if best is not None and best.fewer_joules_than_hf:
        out.headline = (
            f"{best.point.backend} at {best.point.short} used "
            f"{best.fewer_joules_than_hf:.1f}x fewer joules per output token than "
            f"{_loop(hf)} ({best.values[ENERGY_KEY]:.3g} J vs {hf_j:.3g} J)"
        )
    return out


def missing_note(columns: Iterable[tuple[str, Iterable[pts.PointStats]]]) -> str:
    """For a page listing several runs (``(label, points)`` each): which have no energy
    figures, as one sentence; "" when every run has them."""
    without = [
        label for label, points in columns if not any(p.get(ENERGY_KEY) is not None for p in points)
    ]
    if not without:
        return ""
    return f"Energy and cost per token: {NOT_MEASURED} for {', '.join(without)}."
