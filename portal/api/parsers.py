"""Request parsers: strict JSON, and safe YAML for raw spec bodies."""

from __future__ import annotations

from typing import Any

import yaml
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from runners.spec import safe_yaml


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, plus: too-deep nesting is a 400, not a crash."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None


def load_yaml(text: str) -> Any:
    """Parse YAML/JSON text safely; ParseError (400) with the line on failure."""
    try:
        return safe_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc) or "invalid syntax"
        raise ParseError(f"YAML parse error{where}: {problem}") from None


class YAMLParser(parsers.BaseParser):
    """``Content-Type: application/yaml`` (or text/yaml, application/x-yaml): a raw spec."""

    media_type = "application/yaml"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            text = stream.read().decode("utf-8")
        except UnicodeDecodeError:
            raise ParseError("the body is not UTF-8 text") from None
        return load_yaml(text)


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"


class XYAMLParser(YAMLParser):
    media_type = "application/x-yaml"
