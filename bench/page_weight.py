"""The run page's transfer on a first and a repeat load (``bench/portal_scale.py``): the
HTML and every static file it references, gzip-compressed as served, headers included."""

from __future__ import annotations

import gzip
import re
from typing import Any


def _wire_bytes(response: Any) -> tuple[int, bytes]:
    """Bytes on the wire for one response: status line, headers, body as sent (gzip)."""
    if response.streaming:
        body = b"".join(response.streaming_content)
        response.close()
    else:
        body = response.content
    headers = sum(len(k) + len(str(v)) + 4 for k, v in response.headers.items())
    cookies = sum(len(c.output()) + 2 for c in response.cookies.values())
    return len("HTTP/1.1 200 OK\r\n") + headers + cookies + 2 + len(body), body


def _cached_by_browser(response: Any) -> bool:
    """Whether a browser reuses this response without asking again: immutable, and a
    max-age of at least a year."""
    control = response.get("Cache-Control", "")
    found = re.search(r"max-age=(\d+)", control)
    return "immutable" in control and bool(found) and int(found.group(1)) >= 365 * 24 * 3600


def page_weight(user: Any, url: str) -> dict[str, Any]:
    """The run page's transfer on a first and a repeat load, as a browser that accepts
    gzip makes them: the HTML, then every script, stylesheet and icon it references."""
    from django.test import Client

    client = Client(headers={"Accept-Encoding": "gzip, deflate, br"})
    client.force_login(user)
    response = client.get(url)
    first, body = _wire_bytes(response)
    html = gzip.decompress(body) if response.get("Content-Encoding") == "gzip" else body
    assets = re.findall(rb'<(?:script[^>]*?src|link[^>]*?href)="(/static/[^"]+)"', html)
    rows = []
    repeat, _ = _wire_bytes(client.get(url))
    for asset in dict.fromkeys(a.decode() for a in assets):
        found = client.get(asset)
        size, _ = _wire_bytes(found)
        first += size
        again = 0
        if not _cached_by_browser(found):
            check = {
                "If-None-Match": found.get("ETag", ""),
                "If-Modified-Since": found.get("Last-Modified", ""),
            }
            again, _ = _wire_bytes(client.get(asset, headers=check))
        repeat += again
        rows.append(
            (
                asset,
                found.status_code,
                size,
                found.get("Content-Encoding", "-"),
                found.get("Cache-Control", "-"),
                again,
            )
        )
    return {"first": first, "repeat": repeat, "html": len(html), "assets": rows}
