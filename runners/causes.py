"""Why a measurement failed, in one line, and what to do about it.

A failed measurement carries whatever its process said: a sentence from the runner
("the vLLM server exited with code 1 before it was ready. Last lines of its log
(PATH): ...") followed by a log tail, often a chained traceback whose *first* exception
is the cause and whose last line is a wrapper ("Engine core initialization failed. See
root cause above"). A person needs the first real cause, on one line, and the next step.

- ``first_cause(text, logs=True)``: that line: the first exception line (log prefixes
  such as ``(EngineCore pid=7) ERROR 11-30 ... [core.py:1]`` removed, warnings ignored)
  joined to the runner's own sentence. With ``logs`` the log the text points at ("its
  log (PATH)") is read whole, since the cause may be above the quoted tail: only the
  runner does that, on its own files; the portal never opens a path a runner reported.
- ``advice(text)``: the next step for the causes people meet (a model path that does not
  exist, a model the machine cannot fetch, out of memory, no GPU, a context too long, a
  gated model, a slow start), or None; read in the first cause, then the whole text, then
  (with ``logs``) the log, so a setting printed in a log is never taken for the cause.
- ``headline(failures, total)``: the run's failure reason: first line the first failure's
  cause and next step, then the count and one line per failed measurement.

Never imports Django: the runner and the portal (``ingestion._failed_points_reason``) both
use it, so a run fails with the same words whichever of them writes the reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

MAX_LINE = 400
_LOG_BYTES = 1_000_000

# "Last lines of its log (/path/server.log):" as runners/vllm_server.py and the others say.
_LOG_PATH = re.compile(r"its log \(([^()\n]+)\):")
# Prefixes vLLM's logger puts before each line, traceback lines included.
_PREFIXES = (
    re.compile(r"^\((?:[\w.]+) pid=\d+\)\s*"),
    re.compile(r"^(?:ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s*"),
)
_NOISE = re.compile(r"^(?:WARNING|INFO|DEBUG)\s+\d\d-\d\d ")
# An exception line as Python prints it: a dotted name ending in Error/Exception/..., ': text'.
_EXCEPTION = re.compile(
    r"^((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Failure|Fault))"
    r"(?::\s*(.*))?$"
)
# An exception named inside a sentence ("the HF baseline failed: OSError: ...").
_NAMED = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Fault): \S")
# Wrappers that only point elsewhere: never the cause when something else was found.
_WRAPPERS = ("see root cause above", "see the errors", "engine core initialization failed")


def _clean(line: str) -> str:
    for prefix in _PREFIXES:
        line = prefix.sub("", line)
    return line.strip()


def _exceptions(text: str) -> list[str]:
    """The exception lines of ``text`` in order (``Name: message``)."""
    found = []
    for raw in text.splitlines():
        if _NOISE.match(_PREFIXES[0].sub("", raw)):
            continue
        line = _clean(raw)
        match = _EXCEPTION.match(line)
        if match and (match.group(2) or "").strip():
            found.append(line)
    return found


def _root(lines: list[str]) -> str | None:
    for line in lines:
        if not any(w in line.lower() for w in _WRAPPERS):
            return line
    return lines[0] if lines else None


def _read_log(text: str) -> str:
    match = _LOG_PATH.search(text)
    if not match:
        return ""
    path = Path(match.group(1))
    try:
        with path.open("rb") as fh:
            size = path.stat().st_size
            fh.seek(max(0, size - _LOG_BYTES))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _short(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= MAX_LINE else line[: MAX_LINE - 1] + "…"


def first_cause(text: str | None, *, logs: bool = False) -> str:
    """The first real cause in an error text, one line (see the module docstring)."""
    if not text or not text.strip():
        return "no reason given"
    head = text.strip().splitlines()[0]
    if _NAMED.search(head):  # the first line already names the exception
        return _short(head)
    quoted = _LOG_PATH.search(head)
    sentence = head[: quoted.start()].rstrip(" .") if quoted else head.rstrip()
    sentence = re.sub(r"\.?\s*Last lines of$", "", sentence).rstrip(" .")
    body = text.strip()[len(head) :]
    cause = _root((_exceptions(_read_log(text)) if logs else []) or _exceptions(body))
    if cause is None:
        # No exception to name: the sentence without its "Last lines of its log (PATH):"
        # heading (never a heading with nothing under it on this one line), and the log's
        # last line when there is one.
        last = next((_clean(x) for x in reversed(body.splitlines()) if _clean(x)), "")
        if sentence == head.rstrip():
            return _short(head)
        return _short(f"{sentence}; the last line of its log: {last}" if last else sentence)
    if cause in sentence:
        return _short(sentence)
    return _short(f"{sentence}: {cause}")


def explain(text: str) -> str:
    """``text`` with its first real cause (read from the log it points at) put first, the
    rest kept: whoever reads one line, or this text without the log (the portal, for a
    run where only some points failed), still gets the cause. Runner side only."""
    cause = first_cause(text, logs=True)
    head = text.strip().splitlines()[0] if text.strip() else ""
    if not head or cause == _short(head):
        return text
    return f"{cause}\n{text.strip()}"


# (pattern in the error text, the next step). The first that matches wins.
_ADVICE: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"Repo id must be in the form|Incorrect path_or_model_id|Invalid repository ID "
            r"or local directory|does not appear to have a file named config\.json|No such "
            r"file or directory: '[^'\n]*config\.json'",
            re.IGNORECASE,
        ),
        "the model's path does not exist, or holds no model, on the machine that ran it: "
        "check model.id (a local directory must exist there and hold config.json), or use "
        "a hub id",
    ),
    (
        re.compile(
            r"couldn't connect to 'https://huggingface\.co'|outgoing traffic has been "
            r"disabled|LocalEntryNotFoundError|cannot find the requested files in the "
            r"(?:disk )?cache|is not a local folder and is not a valid model identifier",
            re.IGNORECASE,
        ),
        "the machine that ran it could not get the model: it is not in its Hugging Face "
        "cache and hub downloads are off (HF_HUB_OFFLINE=1) or unreachable. Download it "
        "there first (huggingface-cli download MODEL), mount a cache that has it, or use a "
        "local model directory",
    ),
    (
        re.compile(r"gated repo|401 Client Error|access to model .* is restricted", re.I),
        "the model is gated: accept its licence on the hub and give the runner HF_TOKEN",
    ),
    (
        re.compile(r"out of memory|OutOfMemoryError|CUDA error: out of memory", re.I),
        "it ran out of memory: lower max_model_len, gpu_memory_utilization or the "
        "concurrency, or use a larger GPU",
    ),
    (
        re.compile(
            r"No CUDA GPUs are available|Found no NVIDIA driver|CUDA driver version is "
            r"insufficient|no GPU|Failed to infer device type",
            re.I,
        ),
        "no usable GPU where it ran: submit to a machine with one, or set "
        "resources.gpu_count: 0 to benchmark on the CPU",
    ),
    (
        re.compile(
            r"maximum context length|longer than the maximum model length|max_model_len "
            r"\(\d+\) is greater than|larger than the maximum",
            re.I,
        ),
        "prompt plus output tokens exceed the model's context: lower input_len/output_len "
        "or raise model.max_model_len (up to what the model supports)",
    ),
    (
        re.compile(r"not ready within startup_timeout_s", re.I),
        "the server started too slowly: raise startup_timeout_s on the vllm backend",
    ),
    (
        re.compile(r"Unsupported CPU attention configuration", re.I),
        "vLLM's CPU attention does not support this model's head size: use a GPU, or a "
        "model with head_dim 64 or more",
    ),
    (
        re.compile(r"No space left on device", re.I),
        "the disk is full where it ran: free space (model cache, run work dirs)",
    ),
)


def advice(text: str | None, *, logs: bool = False) -> str | None:
    """The next step for a known cause in ``text`` (and with ``logs``, its log), or None."""
    if not text:
        return None
    # The error itself first: a log also holds settings and warnings that only look like
    # a cause (vLLM prints every argument, max_model_len among them, as it starts).
    cause = first_cause(text, logs=logs)
    for haystack in (cause, text, _read_log(text)[-20_000:] if logs else ""):
        for pattern, step in _ADVICE:
            if haystack and pattern.search(haystack):
                return step
    return None


def headline(
    failures: Sequence[tuple[str, str | None]],
    total: int,
    *,
    kept: int = 0,
    model: str | None = None,
    logs: bool = False,
) -> str:
    """A run's failure reason from its failed measurements, in order (``(where, error)``).

    Line 1: the first failure's cause and what to do next (``model`` named in it; ``logs``
    as for ``first_cause``). Line 2:
    how many failed, for how many reasons, and that the rest are kept. Then one line per
    failed measurement (five at most).
    """
    if not failures:
        return "the run failed without a failed measurement to explain it; see the runner's log"
    where, error = failures[0]
    step = advice(error, logs=logs)
    if step and model:
        step = step.replace("MODEL", model)
    first = f"{where}: {first_cause(error, logs=logs).rstrip('.')}"
    if step:
        first += f". Next: {step}"
    reasons = len({advice(e, logs=logs) or first_cause(e, logs=logs) for _, e in failures})
    n = len(failures)
    if kept:
        count = f"{n} of {total} measurements failed; the {kept} that succeeded are kept"
    elif n >= total:
        count = f"all {n} measurements failed" if n > 1 else "the only measurement failed"
    else:
        count = f"{n} of {total} measurements failed"
    if reasons > 1:
        count += f"; {reasons} different causes, listed below"
    elif n > 1:
        count += ", all for this reason"
    if not step:
        count += ". Fix what failed and submit again"
    lines = [first, count[0].upper() + count[1:] + "."]
    if n > 1 or kept:
        lines += [f"- {w}: {first_cause(e, logs=logs)}" for w, e in failures[:5]]
        if n > 5:
            lines.append(f"- and {n - 5} more")
    return "\n".join(lines)
