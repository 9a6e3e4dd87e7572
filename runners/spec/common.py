r"""What every section of the spec shares: the ``Strict`` base model, ``FieldError`` (an
error about a field below the validator that raised it), the limits, the checks for
strings that reach a command line or a Kubernetes object (``_safe``, ``_label``), and
``json_problem``, the check every stored JSON value passes first.

Patterns that validate input are anchored with ``\A``/``\Z`` (or used with
``fullmatch``): ``$`` also matches before a trailing newline, so ``"org/model\n"`` would
pass a ``^...$`` pattern. ``shown`` makes any text safe to echo in a message or a field
path (lone surrogates, which no response can encode, and control characters escaped).

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
_SAFE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._/:@+=\-]*\Z")
_SAFE_PATH = re.compile(r"\A[A-Za-z0-9_./~][A-Za-z0-9._/:@+=\-]*\Z")
_LABEL = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._\-]{0,62}\Z")


def _label(value: str, what: str) -> str:
    """``value`` when it is a label (sweep, backend, adapter, search names), else a
    ValueError naming ``what``."""
    if not _LABEL.match(value):
        raise ValueError(f"{what} must be 1-63 letters, digits, '.', '_' or '-'")
    return value


# Characters no name or key needs: C0 and C1 controls, DEL, and the bidirectional
# embeddings, overrides and isolates that make text display in another order than it is
# stored (U+202A-U+202E, U+2066-U+2069: "Trojan Source").
_FREE_TEXT_BAD = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def free_text_problem(value: str) -> str | None:
    """Why ``value`` cannot be a name (a run's, a key's), or None: a control character or
    a bidirectional override, or a lone surrogate."""
    if _FREE_TEXT_BAD.search(value):
        return "must not contain control characters or bidirectional overrides"
    if _SURROGATE.search(value):
        return "must be valid Unicode (a lone surrogate is not)"
    return None


def shown(text: str, limit: int = 128) -> str:
    """``text`` safe to echo in a message or a field path: printable text unchanged (up to
    ``limit`` characters), every other character (controls, bidirectional overrides, lone
    surrogates, which no response can encode) as a ``\\xNN``/``\\uNNNN`` escape."""
    cut = text[:limit]
    if not cut.isprintable():
        cut = "".join(
            c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}")
            for c in cut
        )
    return cut + ("..." if len(text) > limit else "")


def renderable(text: str) -> str:
    """``text`` with lone surrogates escaped (``\\ud800``) and nothing else changed: what
    an error message echoing input needs to be encodable as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class DuplicateKeys(dict):  # type: ignore[type-arg]
    """A mapping a parser read with a key given more than once (``duplicate``: the first
    such key); ``json_problem`` refuses it rather than let the last value win silently."""

    duplicate: str = ""


MAX_SWEEP_VALUES = 32
MAX_SWEEPS = 8
MAX_BACKENDS = 8
MAX_CONFIGS = 16  # a configuration search's configurations (runners.spec.configsearch)
MAX_REPEATS = 10
MAX_CLIENTS = 64  # load generators per point (processes locally)
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
    (PostgreSQL cannot store them), keys with control characters or bidirectional
    overrides (``free_text_problem``), a key given twice (``DuplicateKeys``), non-finite
    numbers, integers beyond 64 bits, nesting deeper than MAX_JSON_DEPTH, and anything
    that is not a JSON type. The path is safe to echo (``shown``).

    The portal's request parsers check every body with it before anything else reads it,
    and ``parse_spec`` every spec.
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
        if isinstance(value, DuplicateKeys):
            where = f"{path}.{shown(value.duplicate)}" if path else shown(value.duplicate)
            return where, "this key is given twice; a later value would silently replace the first"
        for key, item in value.items():
            if not isinstance(key, str):
                return path, f"keys must be strings, not {type(key).__name__}"
            name = key if key.isprintable() else shown(key)
            where = f"{path}.{name}" if path else name
            if name is not key and (why := free_text_problem(key)):
                return where, f"a key {why}"
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
