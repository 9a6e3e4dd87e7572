"""The HF sequential baseline: one request at a time through transformers' generate().

This is the "naive" loop users compare vLLM against, done carefully so the comparison is
fair to it:

- prompts are random token ids drawn with the spec's seed *before* timing (no tokenizer
  work inside the timed region), special tokens excluded; or, beside servers sent a
  custom JSONL prompt file, that file's first prompts in file order (the servers get
  them in the same order), tokenized as a server does: the text as is, or with the
  model's chat template when the servers are asked through chat;
- warm-up generate() calls of the same shape run first (kernel selection, allocator);
- ``min_new_tokens == max_new_tokens`` so every request produces exactly the requested
  length (the same effect as vLLM's ignore-eos), greedy decoding, KV cache on;
- ``torch.inference_mode()`` and a device synchronisation around each timed request;
- every token is timestamped as generate() emits it (a streamer receives each new token
  after it was copied to the CPU, which synchronises), giving TTFT and inter-token gaps,
  so HF reports the same metrics as vLLM (see ``runners.latency``). Throughput and these
  timestamps come from the same pass: generate() already waits for every token on the
  host to decide whether to stop, so the streamer adds a small copy and a Python call per
  token, which ``bench/hf_overhead.py`` measures against a plain loop without it
  (``raw["timing"]`` says so in every result);
- it owns its cores: pinned to them, torch's threads sized to them
  (``runners.conditions``), and the conditions of the timed loop (CPU time against wall
  time, other processes on its cores, steal, load) recorded as ``conditions``, with
  ``contended`` and the reasons when something competed for them.

It runs on CUDA when present, else CPU. The runner executes it in a child process
(``python -m runners hf ...``, also the reproduce command) so the model, the CUDA
context and the allocator cache are gone before the vLLM server needs the GPU. Its
configuration, and the flags that carry it, are ``runners.hf_config``'s.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from runners import conditions as cond
from runners.hf_config import HFConfig
from runners.latency import client_metrics

TIMING_NOTE = (
    "one pass: throughput over the timed loop, TTFT and inter-token gaps from per-token "
    "timestamps (a generate() streamer) in that same loop"
)


@dataclass
class HFResult:
    """What one baseline run measured (the runner wraps it into a Measurement)."""

    metrics: dict[str, float]
    detail: dict[str, Any]
    raw: dict[str, Any]
    gpu_memory_peak_bytes: int | None = None
    command: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    conditions: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class _TokenClock:
    """A generate() streamer that records when each new token arrives.

    generate() first puts the prompt, then each new token after ``.cpu()``: the copy
    waits for the device, so the timestamp is when the token really exists.
    """

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        now = time.perf_counter()
        self.times.extend([now] * max(1, value.numel()))

    def end(self) -> None:
        pass


def _device():
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_prompts(input_len: int, vocab_size: int, special_ids: set[int], n: int, seed: int):
    """``n`` prompts of exactly ``input_len`` ordinary token ids, reproducible from the seed."""
    import torch

    allowed = torch.tensor([i for i in range(vocab_size) if i not in special_ids])
    gen = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(allowed), (n, input_len), generator=gen)
    return allowed[picks]


def file_prompts(tokenizer: Any, path: str, n: int, chat: bool, skip: int = 0) -> list:
    """``n`` prompts of a JSONL file ({"prompt": ...} per line) in file order from line
    ``skip``, cycling when the file has fewer, as token id tensors: the text tokenized as a
    completions server does, or through the chat template as a chat server does."""
    import json

    import torch

    texts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    texts.append(str(json.loads(line)["prompt"]))
                except (ValueError, KeyError, TypeError):
                    raise ValueError(f"{path}:{number}: not a JSON line with a 'prompt'") from None
    if not texts:
        raise ValueError(f"{path} holds no prompts")
    out = []
    for i in range(skip, skip + n):
        text = texts[i % len(texts)]
        if chat:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "keys"):  # a BatchEncoding (transformers 5's default)
                ids = ids["input_ids"]
        else:
            ids = tokenizer(text).input_ids
        out.append(torch.tensor(list(ids)))
    return out


def _load(config: HFConfig, device):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        config.tokenizer or config.model,
        revision=None if config.tokenizer else config.revision,
        trust_remote_code=config.trust_remote_code,
    )
    kwargs: dict[str, Any] = {}
    if config.attn_implementation:
        kwargs["attn_implementation"] = config.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(
        config.model,
        revision=config.revision,
        dtype=config.dtype,
        trust_remote_code=config.trust_remote_code,
        **kwargs,
    )
    return tokenizer, model.to(device).eval()


def run(config: HFConfig, cores: cond.Cores | None = None) -> HFResult:
    """Measure the baseline on ``cores`` (default: ``conditions.own_cores()``, pinned).

    Raises on load errors; the caller records them as a failure.
    """
    cores = cores or cond.own_cores()
    cond.pin(cores)
    import torch

    torch.set_num_threads(cores.threads)
    device = _device()
    tokenizer, model = _load(config, device)
    # The embedding matrix is authoritative: tokenizers may list fewer ids, models
    # often pad the vocabulary; draw only ids both know, never special ones.
    vocab = min(len(tokenizer), model.get_input_embeddings().num_embeddings)
    special = set(tokenizer.all_special_ids)
    if config.prompts_file is not None:
        chat, path = config.chat_template, config.prompts_file
        prompts = file_prompts(tokenizer, path, config.num_prompts, chat)
        warmups = file_prompts(tokenizer, path, config.num_warmups, chat, skip=config.num_prompts)
    else:
        prompts = random_prompts(config.input_len, vocab, special, config.num_prompts, config.seed)
        warmups = random_prompts(
            config.input_len, vocab, special, config.num_warmups, config.seed + 1
        )
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    gen_kwargs = {
        "max_new_tokens": config.output_len,
        "min_new_tokens": config.output_len,
        "do_sample": False,
        "use_cache": True,
        "pad_token_id": pad_id,
    }

    def generate(ids, streamer=None) -> int:
        ids = ids.unsqueeze(0).to(device)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            streamer=streamer,
            **gen_kwargs,
        )
        return int(out.shape[1] - ids.shape[1])

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    ttfts: list[float] = []
    itls: list[list[float]] = []
    latencies: list[float] = []
    output_lens: list[int] = []
    # perf_counter (CLOCK_MONOTONIC, one clock for every process): the runner's GPU
    # telemetry is summed over these requests (runners.telemetry).
    start_times: list[float] = []
    # The conditions bracket exactly the timed loop (after loading and warm-up).
    watch = cond.Watch(cores, cpu_bound=device.type == "cpu", threads=torch.get_num_threads())
    with torch.inference_mode():
        for ids in warmups:
            generate(ids)
        _sync(device)
        with watch:
            loop_start = time.perf_counter()
            for ids in prompts:
                clock = _TokenClock()
                _sync(device)
                start = time.perf_counter()
                start_times.append(start)
                produced = generate(ids, clock)
                _sync(device)
                end = time.perf_counter()
                times = clock.times[:produced]
                ttfts.append(times[0] - start)
                itls.append([b - a for a, b in itertools.pairwise(times)])
                latencies.append(end - start)
                output_lens.append(produced)
            duration = time.perf_counter() - loop_start

    return timed_result(
        model,
        device,
        config,
        prompts,
        Timed(start_times, ttfts, itls, latencies, output_lens, duration),
        raw={"timing": TIMING_NOTE},
        command=config.command(),
        config=asdict(config),
        conditions=watch.result(),
    )


@dataclass
class Timed:
    """What a timed loop recorded per request, and the loop's wall time."""

    start_times: list[float]
    ttfts: list[float]
    itls: list[list[float]]
    latencies: list[float]
    output_lens: list[int]
    duration: float


def timed_result(
    model: Any,
    device: Any,
    hf_config: HFConfig,
    prompts: list,
    timed: Timed,
    *,
    raw: dict[str, Any],
    command: str,
    config: dict[str, Any],
    conditions: dict[str, Any],
) -> HFResult:
    """Every HF baseline's result from its timed loop: the metrics by ``runners.latency``'s
    definitions, the per-request detail, and the device facts each records, with the
    baseline's own ``raw`` added."""
    import torch

    input_lens = [int(ids.shape[0]) for ids in prompts]
    detail = {
        "input_lens": input_lens,
        "output_lens": timed.output_lens,
        "ttfts": timed.ttfts,
        "itls": timed.itls,
        "latencies": timed.latencies,
        "start_times": timed.start_times,
    }
    metrics = client_metrics(
        **{k: v for k, v in detail.items() if k != "start_times"}, duration=timed.duration
    )
    cuda = device.type == "cuda"
    facts = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch_threads": torch.get_num_threads(),
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "num_warmups": hf_config.num_warmups,
        "seed": hf_config.seed,
    }
    return HFResult(
        metrics=metrics,
        detail=detail,
        raw=facts | raw,
        gpu_memory_peak_bytes=int(torch.cuda.max_memory_allocated(device)) if cuda else None,
        command=command,
        config=config,
        conditions=conditions,
    )
