"""Template filters for numbers the pages show: percentages and sweep values."""

from __future__ import annotations

from typing import Any

from django import template

from portal.web.run_rows import run_rows as render_run_rows

register = template.Library()


@register.filter
def pct(value: float | None, digits: int = 0) -> str:
    """0.123 -> '12%' (a fraction shown as a percentage); '—' for None."""
    if value is None or value == "":
        return "—"
    return f"{float(value) * 100:.{int(digits)}f}%"


@register.filter
def signed_pct(value: float | None, digits: int = 1) -> str:
    """0.052 -> '+5.2%', -0.1 -> '-10.0%'; '—' for None."""
    if value is None or value == "":
        return "—"
    return f"{float(value) * 100:+.{int(digits)}f}%"


@register.filter
def num(value: float | None) -> str:
    """16.0 -> '16', 0.5 -> '0.5'."""
    if value is None or value == "":
        return ""
    value = float(value)
    return str(int(value)) if value.is_integer() else f"{value:g}"


@register.filter
def ibytes(value: float | None) -> str:
    """Bytes in binary units, named as such: 20971520 -> '20.0 MiB'."""
    if value is None or value == "":
        return "—"
    size = float(value)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{size:,.0f} bytes" if unit == "bytes" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} TiB"


@register.simple_tag
def run_rows(runs: Any, selectable: bool = False) -> str:
    """The runs table's rows (``portal.web.run_rows``)."""
    return render_run_rows(runs, bool(selectable))
