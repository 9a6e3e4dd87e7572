"""pydantic's validation errors as this project says them: ``errors_from`` flattens them to
{field: 'a.b.0.c', message} with readable text (a ``FieldError``'s field appended, "did you
mean" for a value not among the choices). Apart from ``io`` so that a section validating a
part on its own (``configsearch``) words its errors the same way."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from runners.choices import choice_message
from runners.spec.backends import BACKEND_KINDS
from runners.spec.common import FieldError


def errors_from(exc: ValidationError) -> list[dict[str, str]]:
    """Flatten pydantic errors to {field: 'a.b.0.c', message} with readable text."""
    out = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"] if p not in BACKEND_KINDS]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):
            loc.append(cause.field)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        elif msg.startswith("Assertion failed, "):
            msg = msg[len("Assertion failed, ") :]
        elif err["type"] in _CHOICE_ERRORS:
            msg = _choice_message(err)
            if err["type"] == "union_tag_invalid":  # the tag is the discriminator's field
                loc.append(str((err.get("ctx") or {}).get("discriminator", "")).strip("'"))
        out.append({"field": ".".join(loc), "message": msg})
    return out


# pydantic's "one of these values" errors, and where each keeps the allowed values.
_CHOICE_ERRORS = {
    "literal_error": "expected",
    "enum": "expected",
    "union_tag_invalid": "expected_tags",
}
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'")


def _choice_message(err: Any) -> str:
    ctx = err.get("ctx") or {}
    allowed = _QUOTED.findall(str(ctx.get(_CHOICE_ERRORS[err["type"]], "")))
    given = ctx["tag"] if err["type"] == "union_tag_invalid" else err.get("input")
    if not allowed:
        return str(err["msg"])
    return choice_message(given, allowed)
