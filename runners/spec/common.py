"""What every section of the spec shares: the ``Strict`` base model, ``FieldError`` (an
error about a field below the validator that raised it), the limits, the checks for
strings that reach a command line or a Kubernetes object (``_safe``, ``_label``), and
``json_problem``, the check every stored JSON value passes first.

The underscored helpers are for the spec's own modules, not part of ``runners.spec``'s API.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

SPEC_VERSION = 1

# Strings that end up on a command line (as argv elements, never through a shell) or in
# a Kubernetes object. Allow what hub ids, paths, versions and labels need, nothing more.
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+=\-]*$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./~][A-Za-z0-9._/:@+=\-]*$")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,62}$")


def _label(value: str, what: str) -> str:
    """``value`` when it is a label (sweep, backend, adapter, search names), else a
    ValueError naming ``what``."""
    if not _LABEL.match(value):
        raise ValueError(f"{what} must be 1-63 letters, digits, '.', '_' or '-'")
    return value


_FREE_TEXT_BAD = re.compile(r"[\x00-\x1f\x7f]")

MAX_SWEEP_VALUES = 32
MAX_SWEEPS = 8
MAX_BACKENDS = 8
MAX_REPEATS = 10
MAX_POINTS = 256
MAX_CONCURRENCY = 100_000  # as many as num_prompts may be: "no limit" is expressible
MAX_JSON_DEPTH = 32
MAX_JSON_INT = 2**63 - 1


class FieldError(ValueError):
    """A validation error about a field below the validator that raised it.

    Model-level checks (unique names, lengths against max_model_len) see the whole
    section; ``errors_from`` appends ``field`` to the section's location so the error
    still names the exact field ('sweeps.1.name', not the spec as a whole).
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _safe(value: str, what: str, pattern: re.Pattern[str] = _SAFE) -> str:
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > 256:
        raise ValueError(f"{what} is longer than 256 characters")
    if ".." in value.split("/"):
        raise ValueError(f"{what} must not contain '..' path segments")
    if not pattern.match(value):
        raise ValueError(
            f"{what} {value!r} contains characters that are not allowed "
            "(use letters, digits and . _ - / : @ + =; no spaces or shell metacharacters)"
        )
    return value


class Strict(BaseModel):
    """Base for every spec section: unknown fields are errors, assignments re-validate,
    and numbers are finite (``1e400``, YAML's ``.inf`` and NaN are errors, not values)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def json_problem(value: Any, path: str = "", depth: int = 0) -> tuple[str, str] | None:
    """The first part of a parsed JSON/YAML value that cannot be stored and shown safely:
    (dotted path, why), or None. Refused: NUL characters and lone surrogates in strings
    (PostgreSQL cannot store them), non-finite numbers, integers beyond 64 bits, nesting
    deeper than MAX_JSON_DEPTH, and anything that is not a JSON type.

    The portal checks specs and runner payloads with it before anything else reads them.
    """
    if isinstance(value, str):
        if "\x00" in value:
            return path, "text must not contain NUL characters"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path, "text must be valid Unicode (a lone surrogate is not)"
        return None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        if abs(value) > MAX_JSON_INT:
            return path, "integer out of range (at most 64 bits)"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (path, "number must be finite (not inf or NaN)")
    if depth >= MAX_JSON_DEPTH:
        return path, f"nested more than {MAX_JSON_DEPTH} levels deep"
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if not isinstance(key, str):
                return path, f"keys must be strings, not {type(key).__name__}"
            problem = json_problem(key, where, depth + 1) or json_problem(item, where, depth + 1)
            if problem:
                return problem
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            problem = json_problem(item, f"{path}.{i}" if path else str(i), depth + 1)
            if problem:
                return problem
        return None
    return path, f"a {type(value).__name__} is not a JSON value"


def _without_defaults(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the keys whose value is the given default: fields added after
    runs were stored stay out of dumps (and so out of every stored fingerprint) until a
    spec sets them."""
    return {k: v for k, v in data.items() if k not in defaults or v != defaults[k]}
