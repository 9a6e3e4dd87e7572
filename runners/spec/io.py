"""Reading and writing specs: ``parse_spec`` (a parsed mapping), ``loads_spec``/``load_spec``
(YAML or JSON text, read by ``safe_yaml``: YAML 1.2 core scalars, no duplicate keys, no
aliases, ``runners.spec.yamlload``), ``dump_spec`` and ``json_schema``; every refusal is a
``SpecError`` whose ``errors`` name their fields (``errors_from``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from runners.spec.common import SPEC_VERSION, json_problem
from runners.spec.errors import errors_from
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
