"""``{% sla_search_section run %}``: the run page's SLA search and endpoint section."""

from __future__ import annotations

from typing import Any

from django import template

from portal.web.sla_search import section

register = template.Library()


@register.inclusion_tag("web/_sla_search.html")
def sla_search_section(run: Any) -> dict[str, Any]:
    return {"section": section(run)}
