"""No pattern that validates input ends with ``$``.

``$`` also matches just before a trailing newline, so ``re.match(r"^[a-z]+$", "abc\\n")``
accepts ``"abc\\n"``: a base URL, a model id or a label "valid" with a newline in it. The
patterns of the spec (``runners/spec``), the portal and the CLI end with ``\\Z`` (or are
used with ``fullmatch``); this reads their source and names any that does not, so the
class stays fixed when a new validator is written. A pattern compiled with ``re.M`` is
about lines, not a whole value, and is left alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHERE = [REPO / "runners" / "spec", REPO / "portal", REPO / "servebench"]
CALLS = {"compile", "match", "search"}  # fullmatch cannot be fooled by a trailing newline
# Pending, one each, with what keeps the defect out meanwhile (none now).
PENDING: set[tuple[str, str]] = set()


def _pattern_end(node: ast.expr) -> str | None:
    """The literal end of a pattern argument (a string, or an f-string's last part)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        last = node.values[-1]
        if isinstance(last, ast.Constant) and isinstance(last.value, str):
            return last.value
    return None


def _multiline(call: ast.Call) -> bool:
    flags = [*call.args[1:], *(k.value for k in call.keywords if k.arg == "flags")]
    return any("M" in ast.unparse(f) or "MULTILINE" in ast.unparse(f) for f in flags)


def dollar_anchored() -> list[str]:
    found = []
    for root in WHERE:
        for path in sorted(root.rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "re"
                    and node.func.attr in CALLS
                    and node.args
                ):
                    continue
                end = _pattern_end(node.args[0])
                if end is None or _multiline(node):
                    continue
                where = str(path.relative_to(REPO))
                if end.endswith("$") and not end.endswith("\\$") and (where, end) not in PENDING:
                    found.append(f"{where}:{node.lineno}")
    return found


def test_no_validating_pattern_ends_with_a_dollar() -> None:
    assert dollar_anchored() == [], (
        "these patterns end with $, which also matches before a trailing newline; "
        "end them with \\Z (or use re.fullmatch)"
    )


def test_the_check_sees_what_it_looks_for(tmp_path: Path) -> None:
    sample = 're.compile(r"^[a-z]+$")\nre.match(rf"^{x}$", v)\nre.search(r"^a$", t, re.M)\n'
    calls = [n for n in ast.walk(ast.parse(sample)) if isinstance(n, ast.Call)]
    ends = [(_pattern_end(c.args[0]), _multiline(c)) for c in calls]
    assert ends == [("^[a-z]+$", False), ("$", False), ("^a$", True)]
