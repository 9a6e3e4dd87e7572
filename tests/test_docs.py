"""The README and docs/ stay what a newcomer can follow: every relative link (and its
``#anchor``) resolves to a file in the repository, nothing they name lives outside it,
every ``servebench`` and ``python -m runners`` command in their code blocks parses with
today's CLI, and the README stays short enough to read once (issue 29: at most 300
lines)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from runners.cli import build_parser as runners_parser
from servebench.cli import build_parser as servebench_parser

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 300
# Files that exist only on the machines the project was built on, never in a checkout.
OUTSIDE = ("FIELD-NOTES", "DESIGN.md", "STYLE.md")

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def prose(path: Path) -> str:
    """The page without its fenced code blocks (a link-like text in code is not a link)."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def code_lines(path: Path) -> list[str]:
    """The lines inside the page's fenced code blocks, comments and continuations joined."""
    out, fenced, pending = [], False, ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            text = pending + line.strip()
            pending = text[:-1] + " " if text.endswith("\\") else ""
            if not pending:
                out.append(text)
    return out


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(page, program, argv) of every servebench / python -m runners command in code."""
    found = []
    for page in pages():
        for line in code_lines(page):
            for prefix, program in (
                ("servebench ", "servebench"),
                ("python -m runners ", "runners"),
            ):
                if line.startswith(prefix) and "--help" not in line:
                    argv = shlex.split(line[len(prefix) :], comments=True)
                    found.append((str(page.relative_to(REPO)), program, argv))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {
        slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", prose(path), re.MULTILINE)
    }


def test_every_relative_link_resolves_to_a_file_and_heading_in_the_repository() -> None:
    broken = []
    for page in pages():
        for target in LINK.findall(prose(page)):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(REPO)}: {target}"
            if not dest.is_relative_to(REPO) or not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} (no heading #{anchor} in {dest.relative_to(REPO)})")
    assert broken == [], "\n".join(broken)


@pytest.mark.parametrize(
    ("page", "program", "argv"),
    documented_commands(),
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_every_documented_command_parses_with_todays_cli(
    page: str, program: str, argv: list[str]
) -> None:
    parser = servebench_parser() if program == "servebench" else runners_parser()
    try:
        parser.parse_args(argv)
    except SystemExit as exc:  # argparse's way of refusing
        raise AssertionError(f"{page}: `{program} {' '.join(argv)}` does not parse") from exc


def test_nothing_the_docs_name_lives_outside_the_repository() -> None:
    found = [
        f"{page.relative_to(REPO)}:{n}: {line.strip()}"
        for page in pages()
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if any(name in line for name in OUTSIDE)
    ]
    assert found == [], "\n".join(found)


def test_the_readme_is_short_enough_to_read_once() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail into docs/"
