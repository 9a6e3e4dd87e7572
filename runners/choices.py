"""One message for a value that is not one of a fixed set of choices, everywhere.

A spec's enum fields and backend kinds, the pages' and API's filters, metric names, the
CLI: each refusal names what was given, the nearest choice ("did you mean") when one is
close, and every choice. Standard library only, so any package may import it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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
