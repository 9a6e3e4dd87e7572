"""The staff page of storage used: samples, telemetry and logs (bytes and counts), the
database's tables, and the retention in force (``portal.ops.retention.usage``)."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from portal.ops import retention


@staff_member_required
@require_GET
def storage_page(request: HttpRequest) -> HttpResponse:
    return render(request, "web/storage.html", {"usage": retention.usage()})
