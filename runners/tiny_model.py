"""A tiny random Qwen3 model that both transformers and vLLM serve, built offline.

Tests and the CPU demo need a real model without hub access. The shape follows the
recipe in docs/development.md: head_dim 64 (vLLM's CPU attention rejects 16), one KV head,
2 layers, vocabulary 512 with a byte-level BPE trained here on a built-in corpus. Weights are
random (seeded), so generated text is noise; only the serving machinery is exercised.

The tokenizer carries a ChatML-style chat template (``CHAT_TEMPLATE``), so
``/v1/chat/completions`` works on it (vLLM refuses chat for a model without one), and
``build_lora`` writes a PEFT LoRA adapter for it (random, seeded) so adapters can be
served next to the base model.

The build is deterministic: the same version of this module writes the same files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

# Bump when the recipe changes so cached copies are rebuilt under a new name.
RECIPE_VERSION = 2  # 2: a chat template
EOS = "<|endoftext|>"
VOCAB_SIZE = 512
SEED = 1234
# ChatML, as Qwen models use it; the markers are plain text to this small vocabulary.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = """\
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow.
abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789
Serving a language model means turning prompts into tokens as fast as the hardware allows.
Continuous batching keeps the accelerator busy: new requests join a running batch as soon
as earlier ones finish, instead of waiting for the whole batch to drain.
PagedAttention stores the key-value cache in fixed-size blocks, so memory is not reserved
for the longest possible sequence and many more sequences stay resident at once.
Throughput is measured in output tokens per second; latency as time to first token,
time per output token and the gaps between tokens. A benchmark that cannot be reproduced
is an anecdote: record the model revision, the software versions and the hardware.
def generate(prompt, max_new_tokens=128): return model(prompt)[-max_new_tokens:]
{"input_len": 1024, "output_len": 128, "max_concurrency": 64, "num_prompts": 256}
1, 4, 16, 64; 128, 1024, 2048; 32, 128, 512, 1024. !@#$%^&*()[]{}<>?/\\|~`'";:,.-_=+
"""


def default_dir() -> Path:
    """Where tests and demos keep the model: outside the repo, shared by checkouts."""
    cache = Path(os.environ.get("SERVEBENCH_CACHE", Path.home() / ".cache" / "servebench"))
    return cache / f"tiny-model-v{RECIPE_VERSION}"


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the corpus so enough merges are frequent to fill the vocabulary.
    tok.train_from_iterator([_CORPUS] * 8, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _model(eos_id: int):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    torch.manual_seed(SEED)
    return Qwen3ForCausalLM(config).to(torch.bfloat16).eval()


def build(target: str | Path) -> Path:
    """Write the tiny model and tokenizer to ``target`` (created; must not hold a model).

    Files are written to a temporary sibling and renamed into place, so a crash or a
    concurrent build never leaves a half-written model behind.
    """
    target = Path(target).expanduser().resolve()
    if (target / "config.json").exists():
        raise FileExistsError(f"{target} already holds a model; choose an empty directory")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by checkouts
    try:
        tokenizer = _tokenizer()
        tokenizer.save_pretrained(tmp)
        _model(tokenizer.convert_tokens_to_ids(EOS)).save_pretrained(tmp)
        if target.exists():
            target.rmdir()  # an empty directory the caller made for us
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def ensure(target: str | Path | None = None) -> Path:
    """The model at ``target`` (default: the shared cache), built once if missing."""
    path = Path(target) if target else default_dir()
    if (path / "config.json").exists():
        return path
    try:
        return build(path)
    except (FileExistsError, OSError):
        # Another process finished the same build first; its copy is identical.
        if (path / "config.json").exists():
            return path
        raise


LORA_RANK = 8
LORA_TARGETS = ("q_proj", "v_proj")


def build_lora(target: str | Path, base: str | Path, seed: int = 1) -> Path:
    """Write a PEFT LoRA adapter (rank ``LORA_RANK`` on ``LORA_TARGETS``) for the tiny
    model at ``base`` into ``target``: random seeded weights, so each seed is another
    adapter. vLLM serves it with ``--enable-lora --lora-modules NAME=TARGET``.
    """
    import torch
    from safetensors.torch import save_file

    base = Path(base).expanduser().resolve()
    config = json.loads((base / "config.json").read_text())
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    out_features = {
        "q_proj": config["num_attention_heads"] * head_dim,
        "v_proj": config["num_key_value_heads"] * head_dim,
    }
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module in LORA_TARGETS:
            stem = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = torch.randn(LORA_RANK, hidden, generator=gen) * 0.02
            b = torch.randn(out_features[module], LORA_RANK, generator=gen) * 0.02
            tensors[f"{stem}.lora_A.weight"] = a.to(torch.bfloat16).contiguous()
            tensors[f"{stem}.lora_B.weight"] = b.to(torch.bfloat16).contiguous()
    target = Path(target).expanduser().resolve()
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(target / "adapter_model.safetensors"))
    adapter = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": LORA_RANK,
        "lora_alpha": 2 * LORA_RANK,
        "lora_dropout": 0.0,
        "target_modules": list(LORA_TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (target / "adapter_config.json").write_text(json.dumps(adapter, indent=2) + "\n")
    return target
