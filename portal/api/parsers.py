"""Request parsers: strict JSON, and safe YAML for raw spec bodies.

Every body is checked where it enters, before any view reads it, so every endpoint and
every field gets the same answer: a value that could not be stored or shown safely
(``runners.spec.json_problem``: NUL and lone surrogates in text, keys with control
characters or bidirectional overrides, a key given twice, NaN and infinities, integers
beyond 64 bits, nesting deeper than ``MAX_JSON_DEPTH``) or YAML that JSON would read
otherwise (``runners.spec.safe_yaml``: YAML 1.1 scalars, duplicate keys) is a 400
``malformed_body`` naming its field (``BodyRefused``). A body that does not parse at all
is a 400 without a field.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any

import yaml
from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from runners.spec import (
    MAX_JSON_DEPTH,
    DuplicateKeys,
    YAMLFieldError,
    json_problem,
    safe_yaml,
    shown,
)


class BodyRefused(ParseError):
    """A body that parses but holds a value no field accepts (module docstring): 400
    naming ``field`` (a dotted path from the body's root; safe to echo)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)

    def under(self, prefix: str) -> BodyRefused:
        """The same refusal with ``field`` under ``prefix`` (a YAML spec is the body's
        ``spec``)."""
        return BodyRefused(f"{prefix}.{self.field}" if self.field else prefix, self.message)


def check_value(data: Any) -> Any:
    """``data`` when every part of it can be stored and shown, else BodyRefused."""
    problem = json_problem(data)
    if problem:
        raise BodyRefused(*problem)
    return data


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object; one with a key given twice is marked for ``json_problem``."""
    data = dict(pairs)
    if len(data) == len(pairs):
        return data
    marked = DuplicateKeys(data)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            marked.duplicate = key
            break
        seen.add(key)
    return marked


def _constant(name: str) -> float:
    """NaN and Infinity read as numbers, so ``json_problem`` refuses them at their field."""
    return float(name)


def _integer(digits: str) -> int:
    """An integer; one longer than any 64-bit integer (thousands of digits, which Python
    would not even convert) as 2**64, so ``json_problem`` refuses it at its field."""
    return 2**64 if len(digits) > 32 else int(digits)


# A JSON string, or one structural character: enough to follow nesting without parsing.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},:]')


def _too_deep_at(text: str) -> str | None:
    """Where JSON ``text`` (too deep for the parser) first nests deeper than
    MAX_JSON_DEPTH: the dotted path of that value, as ``json_problem`` names it, or None
    when it does not (then the text is broken some other way)."""
    stack: list[list[Any]] = []  # per open container: [kind, its current key or index]
    last = '""'
    for match in _TOKEN.finditer(text):
        part = match.group()
        if part[0] == '"':
            last = part
        elif part in ("[", "{"):
            if len(stack) >= MAX_JSON_DEPTH:
                return ".".join(str(where) for _, where in stack)
            stack.append([part, 0 if part == "[" else ""])
        elif part in ("]", "}"):
            if stack:
                stack.pop()
        elif stack and part == "," and stack[-1][0] == "[":
            stack[-1][1] += 1
        elif stack and part == ":" and stack[-1][0] == "{":
            try:
                key = json.loads(last)
            except ValueError:
                key = last[1:-1]
            stack[-1][1] = shown(key)
    return None


def load_json(text: str | bytes) -> Any:
    """JSON text as the API reads every JSON body (module docstring)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
    try:
        data = json.loads(
            text, object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_integer
        )
    except RecursionError:
        where = _too_deep_at(text)
        if where is None:
            raise ParseError("JSON parse error - nested too deeply") from None
        raise BodyRefused(where, f"nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as exc:  # malformed JSON, an integer of 5,000 digits
        raise ParseError(f"JSON parse error - {exc}") from None
    return check_value(data)


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, reading as ``load_json`` does: too-deep nesting, duplicate keys
    and values that cannot be stored are 400s, never a crash or a silent last-wins."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.getreader(encoding)(stream).read()
        except UnicodeDecodeError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        return load_json(text)


def load_yaml(text: str) -> Any:
    """Parse YAML/JSON text safely; ParseError (400) with the line on failure, BodyRefused
    naming the field for what JSON would read otherwise or what cannot be stored."""
    try:
        data = safe_yaml(text)
    except YAMLFieldError as exc:
        raise BodyRefused(exc.field, exc.message) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc) or "invalid syntax"
        raise ParseError(f"YAML parse error{where}: {problem}") from None
    return check_value(data)


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
