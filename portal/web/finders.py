"""Serve plotly.js from the installed plotly package, so pages never load it from a CDN.

The file is exposed as the static path ``vendor/plotly.min.js``; its version is always the
one the ``plotly`` package pins, and collectstatic copies it like any other static file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from django.contrib.staticfiles.finders import BaseFinder
from django.contrib.staticfiles.utils import matches_patterns
from django.core.files.storage import FileSystemStorage

PLOTLY_STATIC_PATH = "vendor/plotly.min.js"


def _package_data_dir() -> str:
    import plotly

    return os.path.join(os.path.dirname(plotly.__file__), "package_data")


class PlotlyFinder(BaseFinder):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=_package_data_dir())
        self.storage.prefix = "vendor"

    def check(self, **kwargs: Any) -> list:
        return []

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> str | list[str]:
        if path != PLOTLY_STATIC_PATH:
            return [] if find_all else ""
        match = self.storage.path("plotly.min.js")
        return [match] if find_all else match

    def list(self, ignore_patterns: list[str] | None) -> Iterator[tuple[str, FileSystemStorage]]:
        if not matches_patterns("plotly.min.js", ignore_patterns or []):
            yield "plotly.min.js", self.storage
