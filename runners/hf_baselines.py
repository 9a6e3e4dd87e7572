"""Two more Hugging Face baselines beside the sequential loop (``runners.hf``).

"Faster than which Hugging Face?": a speedup over a deliberately sequential ``generate()``
loop answers the easiest question. These two answer harder ones, with the same prompts
(``runners.hf.random_prompts`` with the spec's seed, or the custom file's, in order), the
same exact output lengths (``min_new_tokens == max_new_tokens``, greedy) and the same metric
definitions (``runners.latency``):

- ``hf-batched``: the "optimized batch-generation script". At each sweep point the
  point's ``num_prompts`` requests go through ``generate()`` in static batches of the
  point's concurrency (the last one smaller), left-padded when prompts differ in length.
  A batch's requests all start when it starts: each one's TTFT is the batch's first step,
  its inter-token gaps the batch's step gaps, its latency the batch's. Batches run one
  after another, so a request rate does not apply (``raw["request_rate"]`` says so).
- ``hf-static-cache``: sequential like ``hf-sequential``, but ``generate()`` with the
  static KV cache and its forward compiled by ``torch.compile`` (transformers' own
  ``CompileConfig``). Compilation happens in untimed calls before the timed loop: one on
  the warm-up prompt (``raw["compile_s"]``), then one on a prompt of each other distinct
  length the loop will send (a custom prompt file's lengths vary, and a new shape can make
  torch.compile compile again; ``raw["warm_shapes_s"]``, ``raw["compiled_lengths"]``); then
  the warm-ups; then the timed loop. A compilation inside the timed loop all the same
  (counted with dynamo's compile callbacks) fails the measurement, since its numbers would
  include compile time.

Each runs in a child process like the sequential baseline:
``python -m runners.hf_baselines {batched,static-cache} FLAGS --result FILE`` (also the
reproduce command), writing the same result JSON as ``python -m runners hf``. What each
is configured with, from a spec or from those flags, is ``runners.hf_config``'s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from runners import conditions as cond
from runners import hf
from runners.hf_config import (
    COMPILE_BACKENDS,
    BaselineConfig,
    HFConfig,
    add_baseline_flags,
    baseline_from_args,
)


class _StepClock:
    """A generate() streamer that records when each decoding step's tokens exist (one
    timestamp per step, whatever the batch size; the first put is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _prompts(config: HFConfig, tokenizer: Any, model: Any) -> tuple[list, list]:
    """The timed prompts and the warm-up prompts, exactly as ``runners.hf`` draws them."""
    if config.prompts_file is not None:
        chat, path = config.chat_template, config.prompts_file
        prompts = hf.file_prompts(tokenizer, path, config.num_prompts, chat)
        warmups = hf.file_prompts(
            tokenizer, path, max(config.num_warmups, 1), chat, skip=config.num_prompts
        )
        return prompts, warmups
    vocab = min(len(tokenizer), model.get_input_embeddings().num_embeddings)
    special = set(tokenizer.all_special_ids)
    prompts = hf.random_prompts(config.input_len, vocab, special, config.num_prompts, config.seed)
    warmups = hf.random_prompts(
        config.input_len, vocab, special, max(config.num_warmups, 1), config.seed + 1
    )
    return list(prompts), list(warmups)


class _Compiles:
    """Counts torch.compile (dynamo) compilations while it is entered; ``count`` stays
    None on a torch without dynamo's compile callbacks (then nothing is counted).

    The same callbacks also fire when inductor records a CUDA graph (mode
    "reduce-overhead", transformers' default, re-records when the static cache's
    addresses change between generate() calls): that is not a compilation, so only
    dynamo's trigger counts. Older torch calls the callbacks without arguments."""

    def __init__(self) -> None:
        self.count: int | None = None
        self._handler: Any = None

    def _started(self, *args: Any) -> None:
        trigger = getattr(args[0], "callback_trigger", None) if args else None
        if trigger is not None and getattr(trigger, "name", "DYNAMO") != "DYNAMO":
            return
        self.count = (self.count or 0) + 1

    def __enter__(self) -> _Compiles:
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return self
        self._handler, self.count = callback_handler, 0
        callback_handler.register_start_callback(self._started)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._handler is not None:
            self._handler.remove_start_callback(self._started)
            self._handler = None


def one_per_length(prompts: list) -> list:
    """The first prompt of each distinct length, in order: the shapes a sequential loop
    sends to ``generate()``."""
    seen: dict[int, Any] = {}
    for prompt in prompts:
        seen.setdefault(int(prompt.shape[0]), prompt)
    return list(seen.values())


def _left_pad(batch: list, pad_id: int):
    """Stack 1-D id tensors into (ids, attention_mask), left-padded to the longest."""
    import torch

    width = max(int(ids.shape[0]) for ids in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=batch[0].dtype)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, prompt in enumerate(batch):
        n = int(prompt.shape[0])
        ids[row, width - n :] = prompt
        mask[row, width - n :] = 1
    return ids, mask


def run(config: BaselineConfig, cores: cond.Cores | None = None) -> hf.HFResult:
    """Measure ``config`` on ``cores`` (default: ``conditions.own_cores()``, pinned).

    Raises on load errors; the caller records them as a failure."""
    if config.kind == "batched" and config.batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    if config.compile_backend not in COMPILE_BACKENDS:
        raise ValueError(f"compile_backend is one of {', '.join(COMPILE_BACKENDS)}")
    cores = cores or cond.own_cores()
    cond.pin(cores)
    import torch

    torch.set_num_threads(cores.threads)
    device = hf._device()
    tokenizer, model = hf._load(config.hf, device)
    prompts, warmups = _prompts(config.hf, tokenizer, model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out_len = config.hf.output_len
    gen_kwargs: dict[str, Any] = {
        "max_new_tokens": out_len,
        "min_new_tokens": out_len,
        "do_sample": False,
        "use_cache": True,
        "pad_token_id": pad_id,
    }
    size = config.batch_size if config.kind == "batched" else 1
    if config.kind == "static-cache":
        from transformers import CompileConfig

        options: dict[str, Any] = {"backend": config.compile_backend, "fullgraph": False}
        if config.compile_backend != "inductor":
            options["mode"] = None  # modes are inductor's
        compile_config = CompileConfig(**options)
        # transformers compiles only on accelerators unless told to on every device.
        compile_config._compile_all_devices = True
        gen_kwargs |= {"cache_implementation": "static", "compile_config": compile_config}

    def generate(batch: list, streamer: Any = None) -> int:
        ids, mask = _left_pad(batch, pad_id)
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            streamer=streamer,
            **gen_kwargs,
        )
        return int(out.shape[1] - ids.shape[1])

    batches = [prompts[i : i + size] for i in range(0, len(prompts), size)]
    warm_batches = [warmups[i % len(warmups)] for i in range(size)]
    ttfts: list[float] = []
    itls: list[list[float]] = []
    latencies: list[float] = []
    output_lens: list[int] = []
    start_times: list[float] = []
    compile_s = warm_shapes_s = None
    warmed = {int(p.shape[0]) for p in warm_batches}
    shapes = (
        [p for p in one_per_length(prompts) if int(p.shape[0]) not in warmed]
        if config.kind == "static-cache"
        else []
    )
    watch = cond.Watch(cores, cpu_bound=device.type == "cpu", threads=torch.get_num_threads())
    compiles = _Compiles()
    with torch.inference_mode():
        if config.kind == "static-cache":
            t = time.perf_counter()
            generate(warm_batches)  # the compilation
            hf._sync(device)
            compile_s = time.perf_counter() - t
            t = time.perf_counter()
            for prompt in shapes:  # every other shape the timed loop will send
                generate([prompt])
            hf._sync(device)
            warm_shapes_s = time.perf_counter() - t
        for _ in range(config.hf.num_warmups):
            generate(warm_batches)
            if config.kind == "batched" and len(batches[-1]) != size:
                generate(warm_batches[: len(batches[-1])])
        hf._sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with watch, compiles:
            loop_start = time.perf_counter()
            for batch in batches:
                clock = _StepClock()
                hf._sync(device)
                start = time.perf_counter()
                produced = generate(batch, clock)
                hf._sync(device)
                end = time.perf_counter()
                times = clock.times[:produced]
                gaps = [b - a for a, b in itertools.pairwise(times)]
                for _ in batch:
                    start_times.append(start)
                    ttfts.append(times[0] - start)
                    itls.append(list(gaps))
                    latencies.append(end - start)
                    output_lens.append(produced)
            duration = time.perf_counter() - loop_start
    if compiles.count and config.kind == "static-cache":
        raise RuntimeError(
            f"torch.compile compiled {compiles.count} time(s) inside the timed loop, although "
            "every prompt length it sends was run before it: its numbers would "
            "include compilation, so none is reported. Send prompts of fewer distinct "
            "lengths, or report this with the run's environment"
        )

    raw: dict[str, Any] = {"baseline": f"hf-{config.kind}"}
    if config.kind == "batched":
        raw |= {
            "batch_size": size,
            "batches": len(batches),
            "padding": "left",
            "request_rate": "not applicable: static batches run one after another",
            "timing": "each request's TTFT, inter-token gaps and latency are its batch's",
        }
    else:
        raw |= {
            "cache_implementation": "static",
            "compile_backend": config.compile_backend,
            "compile_s": round(compile_s or 0.0, 3),
            # lengths run (untimed) before the loop besides the warm-up's, and their time
            "compiled_lengths": sorted(warmed | {int(p.shape[0]) for p in shapes}),
            "warm_shapes_s": round(warm_shapes_s or 0.0, 3),
            "compiles_in_timed_loop": compiles.count,  # None: this torch cannot count them
            "timing": hf.TIMING_NOTE
            + "; compilation in untimed calls before it, one per distinct prompt length",
        }
    return hf.timed_result(
        model,
        device,
        config.hf,
        prompts,
        hf.Timed(start_times, ttfts, itls, latencies, output_lens, duration),
        raw=raw,
        command=config.command(),
        config={**asdict(config.hf), "kind": config.kind, "batch_size": size}
        | ({"compile_backend": config.compile_backend} if config.kind == "static-cache" else {}),
        conditions=watch.result(),
    )


# --------------------------------------------------------------------------- CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m runners.hf_baselines",
        description="the hf-batched and hf-static-cache baselines (result JSON as 'runners hf')",
    )
    add_baseline_flags(p)
    p.add_argument("--result", help="write the result JSON here instead of printing metrics")
    p.add_argument("--cpus", help="the cores to own (as 'python -m runners hf --cpus')")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cores = cond.own_cores(args.cpus)
        cond.pin(cores)
    except (cond.CoreError, OSError) as exc:
        print(f"cannot own the cores: {exc}", file=sys.stderr)
        return 2
    cond.set_thread_env(cores)  # before torch is imported: OpenMP reads it once
    config = baseline_from_args(args)
    try:
        data = run(config, cores).to_json()
        code = 0
    except Exception as exc:  # reported to the parent runner as the measurement's reason
        traceback.print_exc()
        data, code = (
            {"error": f"the hf-{args.kind} baseline failed: {type(exc).__name__}: {exc}"},
            1,
        )
    text = json.dumps(data)
    if args.result:
        Path(args.result).write_text(text + "\n", encoding="utf-8")
    else:
        print(json.dumps(data.get("metrics", data), indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
