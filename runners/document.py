"""The ``--out`` result document, rewritten atomically after every change.

A run can be killed at any moment (OOM, node drain, Ctrl-C). Writing the whole document
to a temporary file and renaming it over the old one after each measurement means the
file on disk is always complete, valid JSON holding every finished point.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from runners.result import ResultDocument


class DocumentWriter:
    """Keeps ``path`` equal to the latest state of a ResultDocument (no-op without a path)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def write(self, document: ResultDocument) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(document.model_dump(mode="json"), indent=1) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide results from the rest of a team
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
