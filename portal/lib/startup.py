"""What a serving process does once, after Django is set up and before its first request.

``settle()`` imports what the first request would otherwise import (the URLconf and every
view module it names), then moves every object made so far into the garbage collector's
permanent generation (``gc.freeze``). A web process holds a large heap that lives as long
as the process (Django, DRF, plotly, pydantic's schemas, the spec models): without the
freeze, each full collection walks all of it, and a page that allocates a lot (a
comparison judges thousands of cells) triggers several. Measured with
``bench/portal_scale.py`` on a 100,000-run database: building a compare of 8 runs x 20
points took 20-30% less time once the startup heap was frozen (docs/scale.md). Objects
made later are collected as before.

``portal.wsgi`` calls it (each gunicorn worker, as it loads the app);
``bench/portal_scale.py`` calls it too, so it times what is served.
"""

from __future__ import annotations

import gc


def settle() -> None:
    """Import the URLconf's views, then freeze the heap."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - the import of every view module is the point
    gc.collect()  # what startup left as garbage goes first, so it is not kept forever
    gc.freeze()
