"""``{% energy_note columns %}``: on a page of several runs (compare), which of them have no
energy or cost figures: "not measured (no NVML)" (portal.benchmarks.energy)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import template
from django.utils.html import format_html

from portal.benchmarks import energy

register = template.Library()


@register.simple_tag
def energy_note(columns: Iterable[Any]) -> str:
    """A muted paragraph naming the runs without energy figures ("" when all have them).
    ``columns``: compare's columns (``.run``, ``.points``: PointStats by point)."""
    runs = [(c.run.name or c.run.short_id, c.points.values()) for c in columns]
    note = energy.missing_note(runs)
    return format_html('<p class="muted" id="energy-note">{}</p>', note) if note else ""
