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

``--transformers-fields`` (ours too) is the same adapter for ``transformers serve``, which
accepts one field beyond the OpenAI API: ``generation_config``, a JSON string that
becomes the request's ``GenerationConfig``. What vLLM's client would send as its own
fields goes there: ``ignore_eos`` as ``eos_token_id: -1`` (no token ends the answer,
which is what ``ignore_eos`` means in vLLM; ``min_new_tokens`` would not do, continuous
batching drops that logits processor), ``top_k`` (0, transformers' "off", when unset:
its own default is 50, vLLM's is off), ``do_sample`` from the temperature (the server
sets the temperature but not sampling) and a repetition penalty other than 1. So output
lengths are forced, and each response's token count (the server's ``usage``) is checked
against the length asked; the report counts the responses checked and those that differ.

Both adapters also read a streamed answer as vLLM's client reads vLLM's: a server that
sends ``usage`` in the same chunk as the last choice (``transformers serve`` does, with an
empty text and the finish reason) would have that chunk counted as one more token (an
extra inter-token gap) and its ``usage`` ignored (the output length then re-counted by
tokenizing the text, which need not give the tokens generated). Such a chunk is split
into its text, when it has any, and a usage-only chunk, as vLLM and OpenAI send them.
vLLM streams one chunk per token, even one whose text is empty; ``transformers serve``
streams only text, so tokens that decode to nothing (special tokens, a multi-byte
character's first bytes) have no chunk: the report's ``stream`` counts the tokens and
the chunks (inter-token gaps are then per chunk), and a response with no text at all
keeps its last chunk as its one event (its time to first token is its latency) instead
of failing as "never received a valid chunk".

Every request of this process goes to the target's origin only (``--base-url``, or
``--host``/``--port``) and follows no redirect (``runners.egress``; aiohttp follows them
by default): ``install_egress_guard`` wraps the one coroutine each aiohttp request passes
through. A request off that origin, or a redirect answer, ends the client at once with
the reason (status, the host the redirect pointed at, what to do) as its last line and
exit code ``EGRESS_REFUSED_EXIT``, and nothing is sent to the redirect's target.

The client's own CPU time is sampled every ``CPU_SAMPLE_S`` on ``time.perf_counter``
(the clock of its ``start_times``) and written to the same report as ``client_cpu``
(``[[t, cpu_s], ...]``): the runner takes the client's CPU use over the requests' window
from it (``runners.conditions.window_cpu``), the evidence that the load generator itself
was saturated (``runners.bottleneck``). One thread reading ``time.process_time``: no
measurable cost. The same thread samples the event loop thread's run-queue wait
(``client_wait``, ``runners.loadgen``), and ``runners.loadgen`` adds the start barrier of a
point with several clients and the event loop's lag (the send lag) to the report.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, NoReturn

from runners import loadgen
from runners.egress import REDIRECT_STATUSES, Egress, EgressRefused

OPENAI_ONLY_FLAG = "--openai-fields-only"
TRANSFORMERS_FLAG = "--transformers-fields"
ADAPTER_FLAGS = (OPENAI_ONLY_FLAG, TRANSFORMERS_FLAG)
REPORT_ENV = "SERVEBENCH_FIELDS_REPORT"
CPU_SAMPLE_S = 0.1
EGRESS_REFUSED_EXIT = 3  # a request off the target, or a redirect: nothing was sent there

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


def transformers_fields(payload: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``openai_only``, with what transformers serve takes beyond it in its
    ``generation_config`` (see the module docstring). Returns (dropped, added)."""
    ignore_eos = bool(payload.get("ignore_eos"))
    top_k = payload.get("top_k")
    penalty = payload.get("repetition_penalty")
    dropped, added = openai_only(payload)
    temperature = payload.get("temperature")
    config: dict[str, Any] = {
        "do_sample": bool(temperature),
        "top_k": top_k if isinstance(top_k, int) and top_k > 0 else 0,
    }
    if ignore_eos:
        config["eos_token_id"] = -1
    if penalty is not None and float(penalty) != 1.0:
        config["repetition_penalty"] = float(penalty)
    payload["generation_config"] = json.dumps(config, sort_keys=True)
    carried = {"ignore_eos", "top_k", "repetition_penalty"}
    return [k for k in dropped if k not in carried], [*added, "generation_config"]


ADAPTERS = {OPENAI_ONLY_FLAG: openai_only, TRANSFORMERS_FLAG: transformers_fields}


def install_adapter(flag: str, dropped: set[str], added: set[str]) -> None:
    """Make every request body of vLLM's client pass through the adapter of ``flag``."""
    from vllm.benchmarks.lib import endpoint_request_func as erf

    original = getattr(erf, "_update_payload_common", None)
    if original is None:  # a vLLM whose client is built otherwise: refuse, never guess
        raise RuntimeError(
            "this vLLM's bench client has no endpoint_request_func._update_payload_common; "
            f"{flag} (request_fields: openai or transformers) needs updating for it"
        )
    adapt = ADAPTERS[flag]

    def update(payload: dict[str, Any], request_func_input: Any) -> None:
        original(payload, request_func_input)
        gone, new = adapt(payload)
        dropped.update(gone)
        added.update(new)

    erf._update_payload_common = update


def _split(message: str, seen: bool) -> tuple[list[str], bool]:
    """``split_usage``, and whether a chunk with choices has now been seen (one parse of
    each message: this runs in the client's event loop, between its timestamps)."""
    if not message.startswith("data: "):
        return [message], seen
    try:
        data = json.loads(message.removeprefix("data: "))
    except json.JSONDecodeError:
        return [message], seen
    if not isinstance(data, dict):
        return [message], seen
    if not data.get("usage") or not data.get("choices"):
        return [message], seen or bool(data.get("choices"))
    usage = data.pop("usage")
    choice = data["choices"][0] if isinstance(data["choices"][0], dict) else {}
    text = choice.get("text") or (choice.get("delta") or {}).get("content")
    out = [f"data: {json.dumps(data)}"] if text or not seen else []
    return [*out, "data: " + json.dumps({**data, "choices": [], "usage": usage})], True


def split_usage(message: str, seen: bool) -> list[str]:
    """One SSE message as vLLM's client expects it: a chunk carrying both choices and
    ``usage`` becomes its text (if any; or its choices, when the response has had no
    chunk with choices yet: ``seen`` false) and then a usage-only chunk."""
    return _split(message, seen)[0]


def install_usage_split() -> None:
    """Make vLLM's client parse every streamed message through ``split_usage`` (one
    handler per response, so it knows whether the response has had a chunk)."""
    from vllm.benchmarks.lib import endpoint_request_func as erf

    base = erf.StreamedResponseHandler

    class Handler(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.seen = False

        def add_chunk(self, chunk_bytes: bytes) -> list[str]:
            out = []
            for message in super().add_chunk(chunk_bytes):
                parts, self.seen = _split(message, self.seen)
                out += parts
            return out

    erf.StreamedResponseHandler = Handler


def install_length_check(lengths: dict[str, Any], stream: dict[str, int]) -> None:
    """Count, for every request that asked for an exact length (``ignore_eos``), whether
    the tokens the server says it generated are that many (``lengths``: checked,
    differing, and up to 5 examples of asked/got); and, for every response, the tokens
    and the streamed chunks that carried them (``stream``)."""
    from vllm.benchmarks.lib import endpoint_request_func as erf

    lengths.update(checked=0, differing=0, examples=[])
    stream.update(responses=0, tokens=0, chunks=0)
    for name in ("openai", "openai-chat"):
        original = erf.ASYNC_REQUEST_FUNCS[name]

        async def checked(request_func_input: Any, session: Any, pbar: Any = None, _f=original):
            output = await _f(request_func_input, session, pbar)
            if output.success:
                stream["responses"] += 1
                stream["tokens"] += output.output_tokens or 0
                stream["chunks"] += len(output.itl) + 1
            if output.success and request_func_input.ignore_eos:
                lengths["checked"] += 1
                if output.output_tokens != request_func_input.output_len:
                    lengths["differing"] += 1
                    if len(lengths["examples"]) < 5:
                        asked = request_func_input.output_len
                        lengths["examples"].append([asked, output.output_tokens])
            return output

        erf.ASYNC_REQUEST_FUNCS[name] = checked


def install_egress_guard(base_url: str) -> None:
    """Make every aiohttp request of this process go to ``base_url``'s origin only,
    without following redirects (module docstring). Idempotent."""
    import aiohttp

    original = aiohttp.ClientSession._request
    if getattr(original, "servebench_egress", False):
        return
    rule = Egress([base_url], f"the bench client's target ({base_url})")

    async def _request(self: Any, method: str, str_or_url: Any, *args: Any, **kwargs: Any) -> Any:
        url = str(str_or_url)
        try:
            rule.check(method, url)
        except EgressRefused as exc:
            _refuse(exc)
        kwargs["allow_redirects"] = False
        response = await original(self, method, str_or_url, *args, **kwargs)
        if response.status in REDIRECT_STATUSES:
            location = response.headers.get("Location")
            response.release()
            _refuse(rule.redirect_refused(method, url, response.status, location))
        return response

    _request.servebench_egress = True  # type: ignore[attr-defined]
    aiohttp.ClientSession._request = _request  # type: ignore[method-assign]


def _refuse(refusal: EgressRefused) -> NoReturn:
    """End the client at once with the reason as its last line. Not an exception: vLLM's
    request functions turn those into a failed request that its ready check retries for
    minutes (and some callers swallow them); and not a normal exit either, whose teardown
    of the engine's extensions prints pages after the reason (the runner quotes the last
    lines of this log)."""
    sys.stdout.flush()
    print(f"servebench: {refusal}", file=sys.stderr, flush=True)
    os._exit(EGRESS_REFUSED_EXIT)


class CpuSampler:
    """This process's CPU time against ``perf_counter``, every ``interval_s`` (a thread)."""

    def __init__(self, interval_s: float = CPU_SAMPLE_S) -> None:
        self.interval_s = interval_s
        self.samples: list[list[float]] = []
        self.waits: list[list[float]] = []  # [[t, run-queue wait s], ...] (Linux)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)

    def _take(self) -> None:
        t = round(time.perf_counter(), 4)
        self.samples.append([t, round(time.process_time(), 4)])
        if (wait := loadgen.run_queue_wait_s()) is not None:
            self.waits.append([t, round(wait, 4)])

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def start(self) -> None:
        self._take()
        self._thread.start()

    def stop(self) -> list[list[float]]:
        self._stop.set()
        self._thread.join(timeout=1.0)
        self._take()
        return self.samples


def target_url(args: Any) -> str:
    """The server vLLM's client was pointed at (``--base-url``, else host and port)."""
    if getattr(args, "base_url", None):
        return str(args.base_url)
    return f"http://{args.host}:{args.port}"


def main(argv: list[str]) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    adapted: tuple[set[str], set[str]] | None = None
    lengths: dict[str, Any] = {}
    stream: dict[str, int] = {}
    if argv[:1] and argv[0] in ADAPTER_FLAGS:
        flag, argv, adapted = argv[0], argv[1:], (set(), set())
        install_adapter(flag, *adapted)
        install_usage_split()
        install_length_check(lengths, stream)
    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    args = parser.parse_args(argv)
    install_egress_guard(target_url(args))
    hook = loadgen.install()
    sampler = CpuSampler()
    sampler.start()
    try:
        bench_main(args)
    finally:
        report = os.environ.get(REPORT_ENV)
        if report:
            data: dict[str, Any] = {"client_cpu": sampler.stop()}
            data |= {"client_wait": sampler.waits, **hook.facts()}
            if adapted is not None:
                dropped, added = (sorted(names) for names in adapted)
                data |= {"dropped_fields": dropped, "added_fields": added}
                data |= {"lengths": lengths, "stream": stream}
            with open(report, "w", encoding="utf-8") as f:
                json.dump(data, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
