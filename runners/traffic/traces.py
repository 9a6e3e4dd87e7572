"""Trace files read into the requests to replay: when each is sent, how long its prompt
and answer are, and which prefix blocks it shares with others.

Formats (``docs/traffic.md`` lists the columns):

- ``mooncake``: JSONL, one request a line: ``timestamp`` (ms from the trace's start),
  ``input_length``, ``output_length``, ``hash_ids`` (ids of ``block_size``-token prefix
  blocks; requests whose ``hash_ids`` start alike share that prefix).
- ``burstgpt``: CSV with ``Timestamp`` (s), ``Request tokens``, ``Response tokens`` (other
  columns, e.g. ``Model``, ``Log Type``, are ignored). Rows with 0 response tokens (failed
  requests in the original log) are skipped and counted.
- ``azure``: CSV with ``TIMESTAMP`` (a date-time, or seconds), ``ContextTokens``,
  ``GeneratedTokens``.

The window (``start_s``, ``duration_s``, ``max_requests``) is taken in trace time, then
arrival times are multiplied by ``time_scale`` and counted from the window's start.
Prompts are synthesised from token ids: each hash id is one fixed block of tokens (drawn
from a generator seeded by the spec's seed and the id), so equal leading ids give equal
leading tokens, what prefix caching sees in production; the rest of each prompt is its own.
"""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from runners.spec import Trace

COLUMNS = {
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
}


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names the line and the field."""


@dataclass
class TraceRequest:
    at_s: float  # when to send it, seconds after the replay starts (scaled)
    input_len: int
    output_len: int
    hash_ids: list[int] = field(default_factory=list)


@dataclass
class LoadedTrace:
    requests: list[TraceRequest]
    rows: int  # requests in the file
    skipped: int = 0  # rows without an answer (burstgpt failures)
    clipped: int = 0  # requests cut to fit the model's context

    def facts(self) -> dict[str, Any]:
        span = self.requests[-1].at_s if self.requests else 0.0
        return {
            "rows": self.rows,
            "replayed": len(self.requests),
            "skipped_rows": self.skipped,
            "clipped_to_context": self.clipped,
            "span_s": round(span, 3),
            "shared_prefix_requests": sum(1 for r in self.requests if r.hash_ids),
        }


def _int(value: Any, where: str, name: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {name} must be a number, not {value!r}") from None
    if number != int(number) or number < 0:
        raise TraceError(f"{where}: {name} must be a whole number >= 0, not {value!r}")
    return int(number)


def _seconds(value: str, where: str, name: str) -> float:
    try:
        return float(value)
    except ValueError:
        pass
    text = value.strip().replace("T", " ")
    if "." in text:  # Azure writes 7 fractional digits; Python reads at most 6
        head, frac = text.split(".", 1)
        digits = "".join(c for c in frac if c.isdigit())
        text = f"{head}.{digits[:6]}{frac[len(digits) :]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise TraceError(f"{where}: {name} must be seconds or a date-time, not {value!r}") from None


def jsonl_lines(path: Path, shape: str = "an object") -> Iterator[tuple[str, Any]]:
    """(``"<file> line N"``, the decoded value) for each non-blank line of a JSONL file;
    a line that is not JSON, or (``shape`` given) not an object, is a TraceError naming
    it. ``shape=""`` leaves the value's shape to the caller."""
    with path.open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path.name} line {n}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: not JSON ({exc.msg})") from None
            if shape and not isinstance(data, dict):
                raise TraceError(f"{where}: each line is {shape}")
            yield where, data


def _mooncake(path: Path) -> list[tuple[float, int, int, list[int]]]:
    rows = []
    for where, data in jsonl_lines(path):
        for key in ("timestamp", "input_length", "output_length"):
            if key not in data:
                raise TraceError(f"{where}: the field {key!r} is missing")
        hash_ids = data.get("hash_ids") or []
        if not isinstance(hash_ids, list) or not all(isinstance(h, int) for h in hash_ids):
            raise TraceError(f"{where}: hash_ids must be a list of integers")
        at = _int(data["timestamp"], where, "timestamp") / 1000.0
        rows.append(
            (
                at,
                _int(data["input_length"], where, "input_length"),
                _int(data["output_length"], where, "output_length"),
                hash_ids,
            )
        )
    return rows


def _csv(path: Path, fmt: str) -> list[tuple[float, int, int, list[int]]]:
    at_col, in_col, out_col = COLUMNS[fmt]
    rows = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in (at_col, in_col, out_col) if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(
                f"{path.name}: a {fmt} trace needs the columns {at_col!r}, {in_col!r}, "
                f"{out_col!r}; missing: {', '.join(repr(m) for m in missing)}"
            )
        for n, row in enumerate(reader, 2):
            where = f"{path.name} line {n}"
            at = _seconds(row[at_col], where, at_col)
            rows.append(
                (at, _int(row[in_col], where, in_col), _int(row[out_col], where, out_col), [])
            )
    return rows


def load(trace: Trace, path: Path | None = None, max_model_len: int | None = None) -> LoadedTrace:
    """The requests of ``trace``'s window, in arrival order, at their scaled times."""
    source = path or Path(trace.path)
    if not source.is_file():
        raise TraceError(f"the trace file {trace.path} does not exist on the runner's machine")
    rows = _mooncake(source) if trace.format == "mooncake" else _csv(source, trace.format)
    if not rows:
        raise TraceError(f"{source.name}: the trace has no requests")
    rows.sort(key=lambda r: r[0])
    first = rows[0][0]
    end = None if trace.duration_s is None else trace.start_s + trace.duration_s
    loaded = LoadedTrace(requests=[], rows=len(rows))
    for at, input_len, output_len, hash_ids in rows:
        t = at - first
        if t < trace.start_s or (end is not None and t >= end):
            continue
        if output_len < 1 or input_len < 1:
            loaded.skipped += 1
            continue
        if max_model_len is not None and input_len + output_len > max_model_len:
            loaded.clipped += 1
            output_len = min(output_len, max_model_len // 2)
            input_len = min(input_len, max_model_len - output_len)
        request = TraceRequest((t - trace.start_s) * trace.time_scale, input_len, output_len)
        request.hash_ids = hash_ids
        loaded.requests.append(request)
        if trace.max_requests is not None and len(loaded.requests) >= trace.max_requests:
            break
    if not loaded.requests:
        raise TraceError(
            f"the window (start_s {trace.start_s}, duration_s {trace.duration_s}) holds no "
            f"request of the {len(rows)} in {source.name}: widen it"
        )
    return loaded


class TokenSource:
    """Token ids for synthetic prompts: ``block(hash_id)`` is always the same block for
    the same id, ``fresh(n, key)`` is the request's own tokens."""

    def __init__(self, usable: list[int], block_size: int, seed: int) -> None:
        self.usable = usable
        self.block_size = block_size
        self.seed = seed
        self._blocks: dict[int, list[int]] = {}

    def block(self, hash_id: int) -> list[int]:
        if hash_id not in self._blocks:
            rng = random.Random(f"{self.seed}-block-{hash_id}")  # noqa: S311 (prompts)
            self._blocks[hash_id] = rng.choices(self.usable, k=self.block_size)
        return self._blocks[hash_id]

    def fresh(self, n: int, key: str) -> list[int]:
        rng = random.Random(f"{self.seed}-own-{key}")  # noqa: S311 (prompts)
        return rng.choices(self.usable, k=n)

    def prompt(self, request: TraceRequest, index: int) -> list[int]:
        ids: list[int] = []
        for h in request.hash_ids:
            if len(ids) >= request.input_len:
                break
            ids += self.block(h)
        ids = ids[: request.input_len]
        return ids + self.fresh(request.input_len - len(ids), f"trace-{index}")


def usable_ids(tokenizer: Any) -> list[int]:
    """Ordinary token ids (no special or added tokens) of ``tokenizer``."""
    special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())
    return [i for i in range(len(tokenizer)) if i not in special]
