"""Multi-turn conversations to send: synthetic ones (``turns`` user turns of
``workload.input_len`` new tokens each) or read from a file (ShareGPT-style JSON, or a
JSONL of ``{"turns": ["...", ...]}``). A user turn is token ids; the prompt of turn k is the
conversation so far (every earlier user turn and the answer the server gave) plus turn k,
so inputs grow and prefix caching can serve the part already seen. Synthetic turns are
token ids (exact lengths); a file's turns are sent as their text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners.spec import Sessions
from runners.traffic.traces import TokenSource, TraceError, jsonl_lines


@dataclass
class Conversation:
    index: int
    turns: list[list[int] | str]  # each user turn: new token ids (synthetic) or its text


def _sharegpt(path: Path, sessions: Sessions) -> list[list[str]]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path.name}: not JSON ({exc.msg})") from None
    if not isinstance(data, list):
        raise TraceError(f"{path.name}: a ShareGPT file is a JSON list of conversations")
    out = []
    for n, item in enumerate(data):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise TraceError(f"{path.name} item {n}: 'conversations' must be a list")
        human = [
            str(t.get("value", ""))
            for t in turns
            if isinstance(t, dict) and t.get("from") in ("human", "user")
        ]
        human = [h for h in human if h.strip()][: sessions.turns]
        if human:
            out.append(human)
    return out


def _custom(path: Path, sessions: Sessions) -> list[list[str]]:
    out = []
    for where, data in jsonl_lines(path, shape=""):
        turns = data.get("turns") if isinstance(data, dict) else None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise TraceError(
                f'{where}: each line is {{"turns": ["...", ...]}} with at least one user message'
            )
        out.append(turns[: sessions.turns])
    return out


def conversations(
    sessions: Sessions, input_len: int, tokens: TokenSource, tokenizer: Any
) -> list[Conversation]:
    """``num_sessions`` conversations (a file's are reused in order if it has fewer)."""
    if sessions.source == "synthetic":
        return [
            Conversation(
                i, [tokens.fresh(input_len, f"session-{i}-turn-{k}") for k in range(sessions.turns)]
            )
            for i in range(sessions.num_sessions)
        ]
    path = Path(str(sessions.path))
    if not path.is_file():
        raise TraceError(
            f"the sessions file {sessions.path} does not exist on the runner's machine"
        )
    texts = _sharegpt(path, sessions) if sessions.source == "sharegpt" else _custom(path, sessions)
    if not texts:
        raise TraceError(f"{path.name}: no conversation with a user message")
    # A file's turns are sent as the text they are (the server tokenizes them).
    return [Conversation(i, list(texts[i % len(texts)])) for i in range(sessions.num_sessions)]
