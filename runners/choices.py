"""One message for a value that is not one of a fixed set of choices, everywhere.

A spec's enum fields and backend kinds, the pages' and API's filters, metric names, the
CLI: each refusal names what was given, the nearest choice ("did you mean") when one is
close, and every choice. Standard library only, so any package may import it.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable
from typing import NoReturn


def choice_message(given: object, allowed: Iterable[str], what: str = "") -> str:
    """``'hf-sequentail': did you mean 'hf-sequential'? The choices: hf-sequential, ...``;
    ``what`` names the thing (``unknown metric 'x': ...``)."""
    choices = [str(c) for c in allowed]
    text = str(given)[:60]
    shown = f"'{text}'" if isinstance(given, str) else repr(given)[:60]
    if what:
        shown = f"unknown {what} {shown}"
    near = difflib.get_close_matches(text, choices, n=1, cutoff=0.7) if choices else []
    if near:
        return f"{shown}: did you mean '{near[0]}'? The choices: {', '.join(choices)}"
    return f"{shown} is not one of the choices: {', '.join(choices)}"


# argparse's words for a value not among an argument's choices.
_INVALID_CHOICE = re.compile(
    r"argument (?P<arg>[^:]+): invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)"
)


def argparse_message(message: str) -> str:
    """argparse's "invalid choice" error in these words (other messages unchanged)."""
    found = _INVALID_CHOICE.search(message)
    if not found:
        return message
    choices = re.findall(r"'([^']*)'", found.group("choices"))
    return f"{found.group('arg')}: {choice_message(found.group('given'), choices)}"


class ChoiceParser(argparse.ArgumentParser):
    """argparse whose invalid-choice errors say "did you mean" (``argparse_message``)."""

    def error(self, message: str) -> NoReturn:
        super().error(argparse_message(message))
