"""Request bodies sent with ``Content-Encoding: gzip`` (the runner compresses measurements).

A measurement's per-request arrays are tens of MB of JSON for a large point and compress
several times over, so ``runners.report`` sends them gzip-compressed. This middleware
inflates such a body before any view reads it, with two limits: the compressed body is
capped by ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (Django's own check while reading it), and the
inflated size by ``SERVEBENCH_MAX_MEASUREMENT_BYTES``, checked while inflating, so a small
"zip bomb" never expands in memory. Over the limit: 413; not valid gzip: 400; both with
the API's error shape and what to do next.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse


def _error(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(
        {"error": {"code": code, "field": "body", "message": message, "fields": []}},
        status=status,
    )


def inflate(data: bytes, limit: int) -> bytes:
    """The gzip ``data`` inflated; ValueError when it is not valid gzip, OverflowError when
    it inflates to more than ``limit`` bytes (found before inflating past it)."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"the body is not valid gzip ({exc})") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise OverflowError(limit)
    if not inflater.eof:
        raise ValueError("the gzip body is truncated")
    return out


class GzipRequestMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        encoding = request.META.get("HTTP_CONTENT_ENCODING", "").strip().lower()
        if encoding in ("", "identity"):
            return self.get_response(request)
        if encoding != "gzip":
            return _error(
                415,
                "unsupported_encoding",
                f"Content-Encoding {encoding[:40]!r} is not supported; send gzip or nothing",
            )
        limit = settings.SERVEBENCH_MAX_MEASUREMENT_BYTES
        try:
            body = inflate(request.body, limit)
        except RequestDataTooBig:
            return _error(
                413,
                "too_large",
                "the compressed body is larger than this portal accepts "
                f"({settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes)",
            )
        except OverflowError:
            return _error(
                413,
                "too_large",
                f"the body inflates to more than {limit:,} bytes "
                "(SERVEBENCH_MAX_MEASUREMENT_BYTES); measure fewer prompts per point or ask "
                "an admin to raise the limit",
            )
        except ValueError as exc:
            return _error(400, "invalid", str(exc))
        request._body = body  # views and DRF read the inflated body from here
        request.META["CONTENT_LENGTH"] = str(len(body))
        del request.META["HTTP_CONTENT_ENCODING"]
        return self.get_response(request)
