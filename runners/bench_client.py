"""``python -m runners.bench_client ARGS``: vLLM's own ``vllm bench serve``.

These are exactly the modules behind the ``vllm bench serve`` console command (parser,
flags, ``main``); the console script itself cannot start where vLLM is installed under
another distribution name (the CPU build). The runner runs this in a child process so
the client's event loop, tokenizer and GC settings never share a process with the
runner's metrics sampler, and an interrupted point can be killed as a group.

``--openai-fields-only`` (ours, first, removed before vLLM's parser sees the rest) is a
thin request adapter for servers that accept only the OpenAI API's own fields and answer
422 to anything else (TGI's Messages API, ``transformers serve``, strict gateways).
vLLM's client always sends ``repetition_penalty`` on completions, ``ignore_eos`` when
asked (and always for random prompts), ``top_k`` when set, and ``logprobs: null``. The
adapter wraps the one function every request body passes through after it is built
(``endpoint_request_func._update_payload_common``) and drops what the OpenAI API does
not define; on chat it also sends the length limit as ``max_tokens`` next to
``max_completion_tokens`` (both are OpenAI fields; some servers, ``transformers serve``
among them, read only the older one and would otherwise generate to their own limit).
Nothing else changes: the client's timing, streaming parser, datasets and metric
definitions are vLLM's. What it dropped and added is written as JSON to the file named
by ``SERVEBENCH_FIELDS_REPORT`` (the runner records it with the measurement). Without
``ignore_eos`` a server may end a response early: the runner counts how many did (and
how many ran past the limit).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

OPENAI_ONLY_FLAG = "--openai-fields-only"
REPORT_ENV = "SERVEBENCH_FIELDS_REPORT"

# Request body fields of the OpenAI API (completions and chat completions, streaming).
OPENAI_FIELDS = {
    "completions": frozenset(
        {
            "model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream",
            "stream_options", "logprobs", "echo", "stop", "presence_penalty",
            "frequency_penalty", "best_of", "logit_bias", "user", "seed", "suffix",
        }
    ),
    "chat": frozenset(
        {
            "model", "messages", "max_completion_tokens", "max_tokens", "temperature",
            "top_p", "n", "stream", "stream_options", "stop", "presence_penalty",
            "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user", "seed",
            "response_format", "tools", "tool_choice", "parallel_tool_calls", "modalities",
            "reasoning_effort", "service_tier", "store", "metadata", "prediction", "audio",
        }
    ),
}  # fmt: skip


def openai_only(payload: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Drop from ``payload`` what the OpenAI API does not define (and nulls); on chat,
    send the length limit as ``max_tokens`` too. Returns (dropped, added) field names."""
    chat = "messages" in payload
    allowed = OPENAI_FIELDS["chat" if chat else "completions"]
    dropped = sorted(k for k, v in payload.items() if k not in allowed or v is None)
    for key in dropped:
        del payload[key]
    added = []
    if chat and "max_completion_tokens" in payload and "max_tokens" not in payload:
        payload["max_tokens"] = payload["max_completion_tokens"]
        added.append("max_tokens")
    return dropped, added


def install_openai_only(dropped: set[str], added: set[str]) -> None:
    """Make every request body of vLLM's client pass through ``openai_only``."""
    from vllm.benchmarks.lib import endpoint_request_func as erf

    original = getattr(erf, "_update_payload_common", None)
    if original is None:  # a vLLM whose client is built otherwise: refuse, never guess
        raise RuntimeError(
            "this vLLM's bench client has no endpoint_request_func._update_payload_common; "
            f"{OPENAI_ONLY_FLAG} (request_fields: openai) needs updating for it"
        )

    def update(payload: dict[str, Any], request_func_input: Any) -> None:
        original(payload, request_func_input)
        gone, new = openai_only(payload)
        dropped.update(gone)
        added.update(new)

    erf._update_payload_common = update


def main(argv: list[str]) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    adapted: tuple[set[str], set[str]] | None = None
    if argv[:1] == [OPENAI_ONLY_FLAG]:
        argv, adapted = argv[1:], (set(), set())
        install_openai_only(*adapted)
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    try:
        bench_main(parser.parse_args(argv))
    finally:
        report = os.environ.get(REPORT_ENV)
        if adapted is not None and report:
            with open(report, "w", encoding="utf-8") as f:
                dropped, added = (sorted(names) for names in adapted)
                json.dump({"dropped_fields": dropped, "added_fields": added}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
