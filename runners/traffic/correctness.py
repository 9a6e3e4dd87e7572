"""Correctness under load: are the answers a server gives under the point's traffic the
answers it should give?

- ``greedy_agreement`` (reference ``hf``): a sample of the point's successful requests
  (``correctness.sample``, evenly spaced in send order) is decoded again by Transformers,
  greedily, from the same prompt (a chat prompt through the model's chat template), for
  the same number of tokens (no end-of-sequence when the workload ignores it). Both
  answers are compared as token ids: the ids vLLM generated (asked with
  ``return_token_ids``; a server that returns only text has its text and the reference's
  re-tokenized the same way, said in ``compared``). A request's agreement is the share
  of the reference's tokens matched before the first difference (after a difference a
  greedy continuation is another text); the metric is the mean over the sample, and
  ``exact_match_rate`` the share of answers identical throughout. 1.0 means the server
  answers as the reference does; quantization, speculative decoding with a lossy
  verifier, another kernel or a broken batch path lower it.
- ``eval_accuracy`` (``eval_file``): each line ``{"prompt", "expected", "match": "exact" |
  "regex", "output_len"?}``. The prompts are sent within the point's load (spread over its
  span) and scored from those responses: ``exact`` compares the stripped answer with
  ``expected``, ``regex`` searches the answer for it. They are not counted in the speed
  metrics.

Both are metrics of the measurement (higher is better), so compare judges them like any
other: a faster configuration that changes the answers shows as a regression.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runners.spec import Spec
from runners.traffic.traces import TraceError, jsonl_lines

if TYPE_CHECKING:
    from runners.traffic.client import Client, Target

CORRECTNESS_KEYS = ("greedy_agreement", "exact_match_rate", "eval_accuracy")
DEFAULT_EVAL_OUTPUT_LEN = 32


def eval_items(spec: Spec) -> list[dict[str, Any]]:
    """The eval file's items, checked (a bad line names its number and field)."""
    c = spec.correctness
    if c is None or not c.eval_file:
        return []
    path = Path(c.eval_file)
    if not path.is_file():
        raise TraceError(f"the eval file {c.eval_file} does not exist on the runner's machine")
    items = []
    for where, data in jsonl_lines(path):
        for key in ("prompt", "expected"):
            if not isinstance(data.get(key), str):
                raise TraceError(f"{where}: {key!r} must be a string")
        match = data.get("match", "exact")
        if match not in ("exact", "regex"):
            raise TraceError(f"{where}: 'match' is 'exact' or 'regex', not {match!r}")
        if match == "regex":
            try:
                re.compile(data["expected"])
            except re.error as exc:
                raise TraceError(
                    f"{where}: 'expected' is not a regular expression ({exc})"
                ) from None
        output_len = data.get("output_len", DEFAULT_EVAL_OUTPUT_LEN)
        if not isinstance(output_len, int) or not 1 <= output_len <= 4096:
            raise TraceError(f"{where}: 'output_len' must be a whole number from 1 to 4096")
        items.append({**data, "match": match, "output_len": output_len})
    if not items:
        raise TraceError(f"{path.name}: the eval file has no items")
    return items


def score(item: dict[str, Any], answer: str) -> bool:
    if item["match"] == "regex":
        return re.search(item["expected"], answer) is not None
    return answer.strip() == item["expected"].strip()


def agreement(reference: list[int], got: list[int]) -> float:
    """Share of the reference's tokens matched before the first difference."""
    if not reference:
        return 1.0 if not got else 0.0
    same = 0
    for a, b in zip(reference, got, strict=False):
        if a != b:
            break
        same += 1
    return same / len(reference)


def sample(sent: list[Any], n: int) -> list[Any]:
    ok = [s for s in sent if s.output.success]
    if len(ok) <= n:
        return ok
    step = len(ok) / n
    return [ok[int(i * step)] for i in range(n)]


def reference_outputs(spec: Spec, prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """Greedy continuations of each prompt by Transformers (one at a time: no padding
    can change a token)."""
    import torch
    from transformers import AutoModelForCausalLM

    m = spec.model
    dtype = getattr(torch, m.dtype) if m.dtype not in ("auto",) else "auto"
    model = AutoModelForCausalLM.from_pretrained(
        m.id, revision=m.revision, dtype=dtype, trust_remote_code=m.trust_remote_code
    )
    model.eval()
    out = []
    with torch.inference_mode():
        for ids, n in zip(prompts, lengths, strict=True):
            kwargs: dict[str, Any] = {"max_new_tokens": n, "do_sample": False}
            if spec.workload.ignore_eos:
                kwargs["min_new_tokens"] = n
            generated = model.generate(torch.tensor([ids]), **kwargs)
            out.append(generated[0, len(ids) :].tolist())
    return out


def _prompt_ids(client: Client, prompt: Any) -> list[int]:
    tok = client.tokenizer
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        ids = tok.apply_chat_template(prompt, add_generation_prompt=True)
        return list(ids["input_ids"] if isinstance(ids, dict) else ids)
    if isinstance(prompt, list):
        return list(prompt)
    return tok.encode(prompt, add_special_tokens=False)


def check(spec: Spec, client: Client, target: Target) -> dict[str, Any]:
    """The point's correctness facts and metrics (``metrics``: ``CORRECTNESS_KEYS``)."""
    c = spec.correctness
    assert c is not None
    facts: dict[str, Any] = {"metrics": {}}
    tok = client.tokenizer
    if c.reference == "hf":
        chosen = sample(client.sent, c.sample)
        prompts = [_prompt_ids(client, s.prompt) for s in chosen]
        lengths = [s.output.output_tokens or spec.workload.output_len for s in chosen]
        refs = reference_outputs(spec, prompts, lengths)
        scores, exact, examples = [], 0, []
        for s, ref in zip(chosen, refs, strict=True):
            if s.token_ids:  # the server's own ids: compared as they are
                want, got = ref, s.token_ids
            else:  # text only: both re-tokenized the same way
                want = tok.encode(tok.decode(ref), add_special_tokens=False)
                got = tok.encode(s.output.generated_text, add_special_tokens=False)
            a = agreement(want, got)
            scores.append(a)
            exact += want == got
            if a < 1 and len(examples) < 3:
                examples.append({"reference": ref[:32], "server": got[:32]})
        if scores:
            facts["metrics"]["greedy_agreement"] = round(sum(scores) / len(scores), 4)
            facts["metrics"]["exact_match_rate"] = round(exact / len(scores), 4)
        facts["reference"] = {
            "kind": "hf",
            "sampled": len(scores),
            "compared": "token ids" if chosen and chosen[0].token_ids else "re-tokenized text",
            "differing_examples": examples,
        }
    if client.evals:
        answered = [s for s in client.evals if s.output.success]
        right = sum(score(s.eval_item or {}, s.output.generated_text) for s in answered)
        facts["eval"] = {"items": len(client.evals), "answered": len(answered), "correct": right}
        facts["metrics"]["eval_accuracy"] = round(right / max(len(client.evals), 1), 4)
    return facts
