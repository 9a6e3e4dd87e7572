"""How spec text is read (``safe_yaml``): YAML (JSON is YAML) as JSON would read it.

PyYAML's ``SafeLoader`` resolves plain scalars by YAML 1.1, where ``input_len: 1:30`` is
the base-60 number 90, ``enable_prefix_caching: off`` and ``name: no`` are booleans,
``seed: 010`` is 8 (octal), ``1_000`` and ``0x10`` are numbers, ``2026-01-31`` is a date,
and a key given twice keeps its last value silently. JSON, and YAML 1.2 (its core
schema), read none of them that way. Here:

- Plain scalars resolve by the YAML 1.2 core schema: ``null``/``~``/empty, ``true`` and
  ``false`` (three spellings each), decimal integers and floats (``1e3`` included, as in
  JSON; ``.inf`` and ``.nan`` are floats that ``json_problem`` then refuses). Everything
  else is text (a date too).
- A plain scalar that YAML 1.1 reads as another value than YAML 1.2 is refused, naming
  its field and both readings: the 1.1 booleans (``yes``, ``no``, ``on``, ``off``),
  base-60 numbers, ``0x``/``0b`` integers, digits grouped with ``_``, integers with a
  leading zero, and 1.2's ``0o`` octal integers. Quote it to mean the text; write it as
  JSON would to mean the number or the boolean. The same spellings under an explicit ``!!int``,
  ``!!float`` or ``!!bool`` tag are refused too.
- A key given twice in one mapping is refused with its path and both lines.
- Aliases (``*name``) are refused: a few hundred bytes of nested aliases expand to
  gigabytes ("billion laughs"), and a spec never needs them.

Refusals are ``YAMLFieldError`` (a ``yaml.YAMLError``) with ``field`` (the dotted path,
as ``json_problem`` and pydantic name fields) and ``message``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver, Resolver
from yaml.scanner import Scanner

from runners.spec.common import MAX_JSON_DEPTH, shown

_TAG = "tag:yaml.org,2002:"
_BOOL = re.compile(r"\A(?:true|True|TRUE|false|False|FALSE)\Z")
_NULL = re.compile(r"\A(?:~|null|Null|NULL|)\Z")
_INT = re.compile(r"\A[-+]?[0-9]+\Z")
_FLOAT = re.compile(
    r"\A(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))\Z"
)
_LEADING_ZERO = re.compile(r"\A[-+]?0[0-9]")
_HEX = re.compile(r"\A[-+]?0x[0-9a-fA-F]+\Z")
_OCTAL12 = re.compile(r"\A0o[0-7]+\Z")  # an integer in YAML 1.2's core schema, text in 1.1
_YAML11 = Resolver()  # PyYAML's own YAML 1.1 resolution, to see where the two differ
MAX_INT_DIGITS = 32  # more digits than this is beyond 64 bits, whatever they are


class _Core12Resolver(BaseResolver):
    """The YAML 1.2 core schema's implicit tags (module docstring)."""

    yaml_implicit_resolvers: dict[str | None, list[tuple[str, re.Pattern[str]]]] = {}


_Core12Resolver.add_implicit_resolver(_TAG + "bool", _BOOL, list("tTfF"))
_Core12Resolver.add_implicit_resolver(_TAG + "null", _NULL, ["~", "n", "N", ""])
_Core12Resolver.add_implicit_resolver(_TAG + "int", _INT, list("-+0123456789"))
_Core12Resolver.add_implicit_resolver(_TAG + "float", _FLOAT, list("-+0123456789."))


class YAMLFieldError(yaml.MarkedYAMLError):
    """Spec text that parses but says something JSON would not (module docstring):
    ``field`` names where, ``message`` what to write instead."""

    def __init__(self, field: str, message: str, mark: Any = None) -> None:
        super().__init__(problem=f"{field}: {message}" if field else message, problem_mark=mark)
        self.field = field
        self.message = message


class _SpecLoader(Reader, Scanner, Parser, Composer, SafeConstructor, _Core12Resolver):
    """Safe YAML, YAML 1.2 core scalars, no aliases; scalar nodes remember whether their
    type was implied (a plain scalar without a tag)."""

    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        _Core12Resolver.__init__(self)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.constructor.ConstructorError(
                None, None, "YAML aliases (*name) are not accepted", event.start_mark
            )
        return super().compose_node(parent, index)

    def compose_scalar_node(self, anchor: Any) -> Any:
        event = self.peek_event()
        node = super().compose_scalar_node(anchor)
        node.implied = event.tag in (None, "!") and bool(event.implicit[0])
        return node


def _construct_int(loader: SafeConstructor, node: ScalarNode) -> int:
    """An integer; one of more digits than any 64-bit integer has (thousands, which
    Python would not even convert) as 2**64, so ``json_problem`` refuses it at its field."""
    if len(node.value.lstrip("+-")) > MAX_INT_DIGITS:
        return 2**64
    return int(SafeConstructor.construct_yaml_int(loader, node))


_SpecLoader.add_constructor(_TAG + "int", _construct_int)


def _join(path: str, key: str | int) -> str:
    name = shown(key) if isinstance(key, str) else str(key)
    return f"{path}.{name}" if path else name


def _yaml11(value: str) -> Any:
    try:
        return yaml.safe_load(value)
    except (yaml.YAMLError, ValueError):
        return value


def _scalar_problem(node: ScalarNode) -> str | None:
    """Why a scalar's value would be read differently by YAML 1.1 (or by an explicit tag
    than JSON would), or None."""
    value, tag = node.value, node.tag.removeprefix(_TAG)
    text = shown(value, 40)
    if getattr(node, "implied", False):
        if tag == "int" and _LEADING_ZERO.match(value):
            old = _yaml11(value)
            was = f"the octal number {old}" if isinstance(old, int) else "text"
            return (
                f"{text} has a leading zero: YAML 1.1 reads it as {was}, YAML 1.2 and JSON as "
                f"{int(value)}; write {int(value)}, or quote it for the text"
            )
        if tag != "str":
            return None
        if _OCTAL12.match(value):
            return (
                f"{text} is the octal number {int(value[2:], 8)} in YAML 1.2 but text in YAML "
                f"1.1; write {int(value[2:], 8)} (as JSON would), or quote it for the text"
            )
        kind = _YAML11.resolve(ScalarNode, value, (True, False)).removeprefix(_TAG)
        old = _yaml11(value)
        if kind == "int" and _HEX.match(value):
            return (
                f"{text} is the hexadecimal number {old} in YAML, which JSON has not; write "
                f"{old}, or quote it for the text"
            )
        if kind == "bool":
            return (
                f"{text} is {str(old).lower()} in YAML 1.1 but text in YAML 1.2 and JSON; "
                f"write {str(old).lower()}, or quote it for the text"
            )
        if kind in ("int", "float"):
            return (
                f"{text} is the number {old!r} in YAML 1.1 but text in YAML 1.2 and JSON; "
                f"write {old!r} (as JSON would), or quote it for the text"
            )
        return None
    pattern = {"int": _INT, "float": _FLOAT, "bool": _BOOL}.get(tag)
    if pattern is not None and (not pattern.match(value) or _LEADING_ZERO.match(value)):
        return f"{text} is not a YAML 1.2 {tag}; write it as JSON would, or quote it for the text"
    return None


def _check(node: Node, path: str = "", depth: int = 0) -> None:
    """YAMLFieldError for the first scalar read differently than JSON would, or key given
    twice, in document order. Nesting deeper than MAX_JSON_DEPTH is left to
    ``json_problem``."""
    if isinstance(node, ScalarNode):
        problem = _scalar_problem(node)
        if problem:
            raise YAMLFieldError(path, problem, node.start_mark)
        return
    if depth > MAX_JSON_DEPTH:
        return
    if isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            _check(item, _join(path, i), depth + 1)
    elif isinstance(node, MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, ScalarNode) else "?"
            where = _join(path, name)
            if isinstance(key, ScalarNode):
                line, ident = key.start_mark.line + 1, (key.tag, key.value)
                if ident in seen:
                    raise YAMLFieldError(
                        where,
                        f"this key is given twice (lines {seen[ident]} and {line}); a later "
                        "value would silently replace the first: keep one",
                        key.start_mark,
                    )
                seen[ident] = line
            _check(value, where, depth + 1)


def safe_yaml(text: str) -> Any:
    """Parse YAML or JSON text the way every spec reader must (module docstring).

    Raises yaml.YAMLError with a problem_mark when the position is known
    (``YAMLFieldError``, with the field, for what JSON would read otherwise); nesting too
    deep and numbers Python cannot read (an integer of thousands of digits) are YAML
    errors too, never anything else.
    """
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check(node)
        return loader.construct_document(node)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
    except (ValueError, OverflowError) as exc:  # int('9' * 5000) in the int constructor
        raise yaml.YAMLError(f"a value cannot be read: {str(exc)[:120]}") from None
    finally:
        loader.dispose()
