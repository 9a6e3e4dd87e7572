"""The presets this portal offers: the runners' own (``runners.spec.PRESETS``), plus the tiny
CPU demo (``runners.spec.tiny_demo``) while its model directory exists here.

``make run`` builds the tiny model offline and sets SERVEBENCH_TINY_MODEL_DIR, so a new
user's first submission from the form can run on a laptop; a deployment without it lists
only the built-in presets. The form, ``GET /api/v1/presets/`` and ``{"preset": ...}`` bodies
all read this module, so they always agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from runners import spec as rs
from runners.choices import choice_message


def tiny_model_dir() -> str | None:
    """SERVEBENCH_TINY_MODEL_DIR when it holds a model (checked on each call: the quickstart
    may build it after the portal started), else None."""
    configured = str(settings.SERVEBENCH_TINY_MODEL_DIR or "").strip()
    if configured and (Path(configured) / "config.json").is_file():
        return configured
    return None


def available() -> dict[str, dict[str, Any]]:
    """name -> {"title", "description", "build"} for every preset offered here."""
    out = dict(rs.PRESETS)
    model_dir = tiny_model_dir()
    if model_dir is not None:
        out[rs.TINY_DEMO] = {**rs.TINY_DEMO_PRESET, "build": lambda: rs.tiny_demo(model_dir)}
    return out


def build(name: str) -> rs.Spec:
    """The preset's spec; KeyError naming the presets offered here."""
    presets = available()
    if name not in presets:
        raise KeyError(choice_message(name, sorted(presets), "preset"))
    return presets[name]["build"]()


def default_name() -> str:
    """The preset the form starts from: the tiny demo where it can run, else the seed's."""
    return rs.TINY_DEMO if tiny_model_dir() is not None else "seed"
