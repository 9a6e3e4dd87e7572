"""Reading and writing specs: ``parse_spec`` (a parsed mapping), ``loads_spec``/``load_spec``
(YAML or JSON text, read by ``safe_yaml``: YAML 1.2 core scalars, no duplicate keys, no
aliases, ``runners.spec.yamlload``), ``dump_spec`` and ``json_schema``; every refusal is a
``SpecError`` whose ``errors`` name their fields (``errors_from``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from runners.choices import choice_message
from runners.spec.backends import BACKEND_KINDS
from runners.spec.common import SPEC_VERSION, FieldError, json_problem
from runners.spec.root import Spec
from runners.spec.yamlload import YAMLFieldError, safe_yaml


class SpecError(ValueError):
    """A spec that does not validate. ``errors`` is a list of {field, message}."""

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = errors
        first = errors[0]
        where = f"{first['field']}: " if first["field"] else ""
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(f"{where}{first['message']}{more}")


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


def parse_spec(data: Any, *, stored: bool = False) -> Spec:
    """Validate a mapping (already parsed JSON/YAML) into a Spec, raising SpecError.

    ``stored``: the spec of a run accepted earlier (pages, ingestion, compare). Refusals
    added since then (the spec's ``_consistent`` names them) are not applied to it again,
    so tightening a rule for new submissions never makes an old run unreadable."""
    if not isinstance(data, dict):
        raise SpecError([{"field": "", "message": "a spec must be a mapping (JSON object)"}])
    problem = json_problem(data)
    if problem:
        raise SpecError([{"field": problem[0], "message": problem[1]}])
    try:
        return Spec.model_validate(data, context={"stored": stored})
    except ValidationError as exc:
        raise SpecError(errors_from(exc)) from None


def loads_spec(text: str) -> Spec:
    """Parse YAML or JSON text (JSON is YAML) into a Spec, raising SpecError."""
    if len(text) > 1_000_000:
        raise SpecError([{"field": "", "message": "the spec is larger than 1 MB"}])
    try:
        data = safe_yaml(text)
    except YAMLFieldError as exc:
        raise SpecError([{"field": exc.field, "message": exc.message}]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError([{"field": "", "message": f"not valid YAML or JSON{where}"}]) from None
    return parse_spec(data)


def load_spec(path: str | Path) -> Spec:
    """Read a YAML or JSON spec file."""
    return loads_spec(Path(path).read_text(encoding="utf-8"))


def whole_numbers(value: Any) -> Any:
    """``value`` with every float that is a whole number written as an integer (a sweep of
    concurrency ``1.0, 4.0`` reads ``1, 4``); the values compare equal, so it reads back
    to the same spec."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


def dump_spec(spec: Spec, fmt: Literal["yaml", "json"] = "yaml") -> str:
    data = whole_numbers(spec.model_dump(mode="json", exclude_none=True))
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the spec, exported from the pydantic model."""
    schema = Spec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = f"https://servebench.dev/schema/spec-v{SPEC_VERSION}.json"
    return schema
