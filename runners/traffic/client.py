"""``python -m runners.traffic ARGS``: servebench's client for production traffic, a trace
replayed at its own times or multi-turn sessions, against one server or endpoint.

vLLM's ``bench serve`` has neither mode, so the schedule is ours; everything that defines
a number is vLLM's: each request is made by vLLM's own request function
(``vllm.benchmarks.lib.endpoint_request_func``: the same payload, streaming parser and
timestamps), and the metrics come from vLLM's ``calculate_metrics`` over those outputs,
with the benchmark's duration taken as vLLM's client takes it (from the first send after
the warm-ups to the last answer). So TTFT, TPOT, ITL, E2E and the throughputs mean what
they mean in ``vllm bench serve``; tests/runners/test_traffic.py checks both clients on
the same single-turn requests. The result file has the keys of ``vllm bench serve
--save-result --save-detailed`` plus ``traffic`` (what only this client knows):

- ``lag``: how late each request was sent against its schedule (the trace's arrival
  time, or the end of the previous turn plus the think time): mean, p50, p99, max in ms;
  ``kept_up`` is false, with a note, when the p99 passes the limit (the load the server
  saw was then lighter than the trace's).
- ``per_turn`` (sessions): requests, mean input tokens, TTFT and E2E, and the prefix-cache
  hit rate of each turn, from the ``cached_tokens`` the server reports per request
  (vLLM: ``--enable-prompt-tokens-details``, which the runner sets; read from the same
  streamed usage vLLM's parser reads).
- ``trace`` (replay): rows, requests replayed, skipped and clipped ones.
- ``correctness`` (``runners.traffic.correctness``) when the spec asks for it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runners.spec import API_ENDPOINTS, Spec, parse_spec
from runners.traffic import sessions as sess
from runners.traffic import traces

PERCENTILES = [50.0, 90.0, 99.0]
DEFAULT_LAG_LIMIT_MS = 50.0
_CACHED: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "servebench_cached", default=None
)


@dataclass
class Sent:
    """One request as sent: its place in the workload, its schedule and vLLM's output."""

    output: Any
    due: float  # perf_counter time it was meant to be sent
    session: int | None = None
    turn: int | None = None
    cached_tokens: int | None = None
    prompt: Any = None
    token_ids: list[int] | None = None  # generated, when the server returned them
    eval_item: dict[str, Any] | None = None

    @property
    def lag_s(self) -> float:
        return max(0.0, self.output.start_time - self.due)


@dataclass
class Target:
    base_url: str
    api: str  # completions | chat
    model: str  # the tokenizer's name
    served: str  # the name requests ask for
    ids: bool  # prompts as token ids (vLLM completions) or text
    ignore_eos: bool
    extra_body: dict[str, Any] = field(default_factory=dict)
    token_ids: bool = False  # ask for the generated token ids (vLLM: return_token_ids)
    lora_names: list[str] = field(default_factory=list)  # adapters requests ask for
    lora_assignment: str = "random"


def install_cached_tokens() -> None:
    """Read ``usage.prompt_tokens_details.cached_tokens`` (and, when the correctness check
    asked for them, each chunk's generated ``token_ids``) from the stream vLLM's parser
    reads (its handler, subclassed: the messages are untouched) into the running
    request's context."""
    from vllm.benchmarks.lib import endpoint_request_func as erf

    base = erf.StreamedResponseHandler
    if getattr(base, "servebench_cached", False):
        return

    class Handler(base):  # type: ignore[misc, valid-type]
        servebench_cached = True

        def add_chunk(self, chunk_bytes: bytes) -> list[str]:
            messages = super().add_chunk(chunk_bytes)
            box = _CACHED.get()
            for message in messages:
                if box is None:
                    continue
                ids = box.get("token_ids")
                if '"prompt_tokens_details"' not in message and (
                    ids is None or '"token_ids"' not in message
                ):
                    continue
                try:
                    data = json.loads(message.removeprefix("data: "))
                except json.JSONDecodeError:
                    continue
                if not isinstance(data, dict):
                    continue
                for choice in data.get("choices") or []:
                    if ids is not None and isinstance(choice.get("token_ids"), list):
                        ids.extend(choice["token_ids"])
                details = (data.get("usage") or {}).get("prompt_tokens_details") or {}
                if isinstance(details.get("cached_tokens"), int):
                    box["cached_tokens"] = details["cached_tokens"]
            return messages

    erf.StreamedResponseHandler = Handler


class Client:
    def __init__(self, spec: Spec, target: Target, tokenizer: Any) -> None:
        from vllm.benchmarks.lib.endpoint_request_func import (
            ASYNC_REQUEST_FUNCS,
            RequestFuncInput,
        )

        self.spec = spec
        self.target = target
        self.tokenizer = tokenizer
        self.func = ASYNC_REQUEST_FUNCS["openai-chat" if target.api == "chat" else "vllm"]
        self.Input = RequestFuncInput
        self.url = f"{target.base_url}{API_ENDPOINTS[target.api]}"
        trace = spec.workload.trace
        self.tokens = traces.TokenSource(
            traces.usable_ids(tokenizer), trace.block_size if trace else 512, spec.workload.seed
        )
        self.sent: list[Sent] = []
        self.evals: list[Sent] = []
        self._requests = 0
        self._lora_rng = random.Random(spec.workload.seed)  # noqa: S311 (an assignment)

    def _model_name(self) -> str:
        """The name this request asks for: an adapter (as vLLM's client assigns them:
        round-robin or seeded random), else the served model."""
        names = self.target.lora_names
        self._requests += 1
        if not names:
            return self.target.served
        if self.target.lora_assignment == "round-robin":
            return names[(self._requests - 1) % len(names)]
        return self._lora_rng.choice(names)

    # ------------------------------------------------------------------ one request

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    async def _send(
        self, http: Any, prompt: Any, prompt_len: int, output_len: int, ignore_eos: bool
    ) -> tuple[Any, dict[str, Any]]:
        box: dict[str, Any] = {"token_ids": []} if self.target.token_ids else {}
        _CACHED.set(box)
        kwargs: dict[str, Any] = {}
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            kwargs["chat_messages"] = prompt
            prompt = ""
        request = self.Input(
            prompt=prompt,
            api_url=self.url,
            prompt_len=prompt_len,
            output_len=output_len,
            model=self.target.model,
            model_name=self._model_name(),
            ignore_eos=ignore_eos,
            extra_body=dict(self.target.extra_body),
            **kwargs,
        )
        output = await self.func(request, http)
        return output, box

    def _single(self, ids: list[int]) -> Any:
        if self.target.api == "chat":
            return [{"role": "user", "content": self._text(ids)}]
        return ids if self.target.ids else self._text(ids)

    # ------------------------------------------------------------------ the schedules

    async def _at(self, http: Any, t0: float, at: float, ids: list[int], out_len: int) -> None:
        await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
        output, box = await self._send(
            http, self._single(ids), len(ids), out_len, self.target.ignore_eos
        )
        self.sent.append(
            Sent(
                output,
                t0 + at,
                cached_tokens=box.get("cached_tokens"),
                prompt=self._single(ids),
                token_ids=box.get("token_ids"),
            )
        )

    async def replay(self, http: Any, loaded: traces.LoadedTrace, t0: float) -> None:
        jobs = [
            self._at(http, t0, r.at_s, self.tokens.prompt(r, i), r.output_len)
            for i, r in enumerate(loaded.requests)
        ]
        await asyncio.gather(*jobs)

    def _turn_text(self, turn: list[int] | str) -> str:
        return turn if isinstance(turn, str) else self._text(turn)

    def _context(self, history: list[tuple[list[int] | str, str]], user: list[int] | str) -> Any:
        """The conversation so far plus ``user``: messages (chat), token ids (synthetic
        turns to vLLM) or text (a file's turns, or a server that takes only text)."""
        if self.target.api == "chat":
            messages = []
            for turn, answer in history:
                messages += [
                    {"role": "user", "content": self._turn_text(turn)},
                    {"role": "assistant", "content": answer},
                ]
            return [*messages, {"role": "user", "content": self._turn_text(user)}]
        if isinstance(user, str) or not self.target.ids:
            text = "".join(self._turn_text(turn) + answer for turn, answer in history)
            return text + self._turn_text(user)
        ids: list[int] = []
        for turn, answer in history:
            assert not isinstance(turn, str)
            ids += turn + self.tokenizer.encode(answer, add_special_tokens=False)
        return ids + user

    def _prompt_len(self, prompt: Any) -> int:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            return len(self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True))
        if isinstance(prompt, list):
            return len(prompt)
        return len(self.tokenizer.encode(prompt, add_special_tokens=False))

    async def _conversation(
        self, http: Any, conv: sess.Conversation, arrival: float, gate: asyncio.Semaphore
    ) -> None:
        s = self.spec.workload.sessions
        assert s is not None
        await asyncio.sleep(max(0.0, arrival - time.perf_counter()))
        async with gate:
            due = time.perf_counter()
            history: list[tuple[list[int] | str, str]] = []
            for k, user in enumerate(conv.turns):
                prompt = self._context(history, user)
                output, box = await self._send(
                    http,
                    prompt,
                    self._prompt_len(prompt),
                    self.spec.workload.output_len,
                    self.target.ignore_eos,
                )
                cached, ids = box.get("cached_tokens"), box.get("token_ids")
                self.sent.append(Sent(output, due, conv.index, k + 1, cached, prompt, ids))
                if not output.success:
                    break  # the conversation cannot go on without its answer
                history.append((user, output.generated_text))
                due = time.perf_counter() + s.think_time_s
                if s.think_time_s:
                    await asyncio.sleep(s.think_time_s)

    async def converse(self, http: Any, convs: list[sess.Conversation], t0: float) -> None:
        s = self.spec.workload.sessions
        assert s is not None
        gate = asyncio.Semaphore(s.session_concurrency or len(convs))
        rng = random.Random(self.spec.workload.seed)  # noqa: S311 (a schedule)
        arrival, jobs = t0, []
        for conv in convs:
            jobs.append(self._conversation(http, conv, arrival, gate))
            if s.session_rate:
                arrival += rng.expovariate(s.session_rate)
        await asyncio.gather(*jobs)

    async def evaluate(self, http: Any, items: list[dict[str, Any]], t0: float, span: float):
        """The eval file's prompts, spread over the load's span (scored afterwards)."""
        step = span / max(len(items), 1)
        for i, item in enumerate(items):
            await asyncio.sleep(max(0.0, t0 + i * step - time.perf_counter()))
            ids = self.tokenizer.encode(item["prompt"], add_special_tokens=False)
            prompt = self._single(ids)
            output, _ = await self._send(http, prompt, len(ids), item["output_len"], False)
            self.evals.append(Sent(output, t0 + i * step, prompt=prompt, eval_item=item))

    async def warm_up(self, http: Any) -> None:
        for i in range(min(self.spec.workload.num_warmups, 4)):
            ids = self.tokens.fresh(16, f"warmup-{i}")
            await self._send(http, self._single(ids), 16, 4, True)


# ---------------------------------------------------------------------- the numbers


def _ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values) * 1000
    return {
        "mean_ms": round(float(arr.mean()), 3),
        "p50_ms": round(float(np.percentile(arr, 50)), 3),
        "p99_ms": round(float(np.percentile(arr, 99)), 3),
        "max_ms": round(float(arr.max()), 3),
    }


def lag_summary(sent: list[Sent], limit_ms: float) -> dict[str, Any]:
    lags = [s.lag_s for s in sent]
    summary: dict[str, Any] = {**_ms(lags), "limit_ms": limit_ms}
    summary["kept_up"] = bool(lags) and summary["p99_ms"] <= limit_ms
    late = sum(1 for lag in lags if lag * 1000 > limit_ms)
    summary["late_requests"] = late
    if lags and not summary["kept_up"]:
        summary["note"] = (
            f"the client could not keep up: p99 send lag {summary['p99_ms']:.1f} ms is above "
            f"{limit_ms:g} ms ({late} of {len(lags)} requests late), so the server saw a "
            "lighter load than scheduled. Next: give the client more CPU (fewer other "
            "processes on the runner's cores) or replay at a larger time_scale"
        )
    return summary


def per_turn(sent: list[Sent]) -> list[dict[str, Any]]:
    turns = sorted({s.turn for s in sent if s.turn is not None})
    rows = []
    for k in turns:
        done = [s for s in sent if s.turn == k and s.output.success]
        row: dict[str, Any] = {"turn": k, "requests": sum(1 for s in sent if s.turn == k)}
        if done:
            row["mean_input_tokens"] = round(float(np.mean([s.output.prompt_len for s in done])), 1)
            row["mean_ttft_ms"] = round(float(np.mean([s.output.ttft for s in done])) * 1000, 3)
            row["p99_ttft_ms"] = round(
                float(np.percentile([s.output.ttft for s in done], 99)) * 1000, 3
            )
            row["mean_e2el_ms"] = round(float(np.mean([s.output.latency for s in done])) * 1000, 3)
            cached = [s for s in done if s.cached_tokens is not None]
            if cached:
                prompt = sum(s.output.prompt_len for s in cached)
                row["prefix_cache_hit_rate"] = round(
                    sum(s.cached_tokens or 0 for s in cached) / max(prompt, 1), 4
                )
        rows.append(row)
    return rows


def vllm_result(spec: Spec, sent: list[Sent], duration: float, tokenizer: Any) -> dict[str, Any]:
    """The keys of ``vllm bench serve --save-result --save-detailed``, from vLLM's own
    ``calculate_metrics``."""
    from vllm.benchmarks.serve import calculate_metrics

    outputs = [s.output for s in sent]
    goodput = {}
    if spec.slo:
        goodput = {
            k.removesuffix("_ms"): v for k, v in spec.slo.model_dump(exclude_none=True).items()
        }
    metrics, output_lens = calculate_metrics(
        input_requests=[],
        outputs=outputs,
        dur_s=duration,
        tokenizer=tokenizer,
        selected_percentiles=PERCENTILES,
        goodput_config_dict=goodput,
    )
    result: dict[str, Any] = {
        "duration": duration,
        "completed": metrics.completed,
        "failed": metrics.failed,
        "num_prompts": len(outputs),
        "total_input_tokens": metrics.total_input,
        "total_output_tokens": metrics.total_output,
        "request_throughput": metrics.request_throughput,
        "request_goodput": metrics.request_goodput if goodput else None,
        "output_throughput": metrics.output_throughput,
        "total_token_throughput": metrics.total_token_throughput,
        "max_output_tokens_per_s": metrics.max_output_tokens_per_s,
        "max_concurrent_requests": metrics.max_concurrent_requests,
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": output_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "latencies": [o.latency for o in outputs],
        "start_times": [o.start_time for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
    }
    for name in ("ttft", "tpot", "itl", "e2el"):
        result[f"mean_{name}_ms"] = getattr(metrics, f"mean_{name}_ms")
        result[f"median_{name}_ms"] = getattr(metrics, f"median_{name}_ms")
        result[f"std_{name}_ms"] = getattr(metrics, f"std_{name}_ms")
        for p, value in getattr(metrics, f"percentiles_{name}_ms"):
            result[f"p{int(p) if int(p) == p else p}_{name}_ms"] = value
    return {k: float(v) if isinstance(v, np.floating) else v for k, v in result.items()}


# ---------------------------------------------------------------------- the run


async def drive(spec: Spec, target: Target, tokenizer: Any) -> dict[str, Any]:
    import aiohttp

    from runners.traffic import correctness

    w = spec.workload
    client = Client(spec, target, tokenizer)
    loaded = convs = None
    facts: dict[str, Any] = {"mode": "trace" if w.trace else "sessions"}
    if w.trace is not None:
        loaded = traces.load(w.trace, max_model_len=spec.model.max_model_len)
        facts["trace"] = loaded.facts()
    else:
        assert w.sessions is not None
        convs = sess.conversations(w.sessions, w.input_len, client.tokens, tokenizer)
    items = correctness.eval_items(spec)
    timeout = aiohttp.ClientTimeout(total=6 * 60 * 60)
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, trust_env=False) as http:
        await client.warm_up(http)
        t0 = time.perf_counter()
        load = client.replay(http, loaded, t0) if loaded else client.converse(http, convs or [], t0)
        span = loaded.requests[-1].at_s if loaded else 0.05 * len(items)
        jobs = [load]
        if items:
            jobs.append(client.evaluate(http, items, t0, max(span, 0.05 * len(items))))
        await asyncio.gather(*jobs)
        duration = (
            max(
                (s.output.start_time + s.output.latency for s in client.sent if s.output.success),
                default=time.perf_counter(),
            )
            - t0
        )
    client.sent.sort(key=lambda s: s.output.start_time)
    result = vllm_result(spec, client.sent, max(duration, 1e-9), tokenizer)
    limit = w.trace.lag_limit_ms if w.trace else DEFAULT_LAG_LIMIT_MS
    facts["lag"] = lag_summary(client.sent, limit)
    if convs is not None:
        facts["per_turn"] = per_turn(client.sent)
        facts["sessions"] = len(convs)
    cached = [s for s in client.sent if s.cached_tokens is not None and s.output.success]
    if cached:
        facts["prefix_cached_tokens"] = sum(s.cached_tokens or 0 for s in cached)
        facts["prefix_cache_hit_rate"] = round(
            facts["prefix_cached_tokens"] / max(sum(s.output.prompt_len for s in cached), 1), 4
        )
    else:
        facts["prefix_cache_note"] = (
            "the server reported no cached tokens per request (vLLM does with "
            "--enable-prompt-tokens-details); see the point's server metrics for the hit rate"
        )
    if spec.correctness is not None:
        facts["correctness"] = correctness.check(spec, client, target)
    result["traffic"] = facts
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m runners.traffic", description=__doc__)
    p.add_argument("--spec", required=True, help="The spec (JSON) whose workload to send.")
    p.add_argument("--base-url", required=True)
    p.add_argument("--api", choices=sorted(API_ENDPOINTS), default="completions")
    p.add_argument("--served-model-name", help="The model name requests ask for.")
    p.add_argument(
        "--text-prompts", action="store_true", help="Send text, not token ids (non-vLLM servers)."
    )
    p.add_argument("--openai-fields-only", action="store_true")
    p.add_argument("--lora-modules", nargs="+", default=[], help="Adapters to ask for.")
    p.add_argument("--lora-assignment", choices=["random", "round-robin"], default="random")
    p.add_argument("--result", required=True, help="Where to write the result JSON.")
    return p


def main(argv: list[str]) -> int:
    from transformers import AutoTokenizer

    from runners.bench_client import OPENAI_ONLY_FLAG, install_adapter, install_egress_guard

    args = build_parser().parse_args(argv)
    spec = parse_spec(json.loads(Path(args.spec).read_text()), stored=True)
    install_egress_guard(args.base_url)
    install_cached_tokens()
    if args.openai_fields_only:
        install_adapter(OPENAI_ONLY_FLAG, set(), set())
    w = spec.workload
    extra: dict[str, Any] = {"temperature": w.temperature}
    if w.top_p is not None:
        extra["top_p"] = w.top_p
    if w.top_k is not None:
        extra["top_k"] = w.top_k
    m = spec.model
    tokenizer = AutoTokenizer.from_pretrained(
        m.tokenizer or m.id, trust_remote_code=m.trust_remote_code
    )
    # The correctness check compares token ids: vLLM returns them when asked.
    token_ids = (
        spec.correctness is not None
        and spec.correctness.reference == "hf"
        and not args.text_prompts
    )
    if token_ids:
        extra["return_token_ids"] = True
    target = Target(
        lora_names=args.lora_modules,
        lora_assignment=args.lora_assignment,
        token_ids=token_ids,
        base_url=args.base_url,
        api=args.api,
        model=m.id,
        served=args.served_model_name or m.id,
        ids=not args.text_prompts and args.api == "completions",
        ignore_eos=w.ignore_eos,
        extra_body=extra,
    )
    try:
        result = asyncio.run(drive(spec, target, tokenizer))
    except traces.TraceError as exc:
        print(f"servebench: {exc}", file=sys.stderr, flush=True)
        return 2
    Path(args.result).write_text(json.dumps(result))
    return 0
