"""The tiny test model: the recipe in docs/development.md, offline, deterministic."""

from __future__ import annotations

import json

import pytest

from runners.cli import main
from runners.tiny_model import EOS, build


def test_it_follows_the_recipe(tiny_model):
    config = json.loads((tiny_model / "config.json").read_text())
    assert {k: config[k] for k in ("vocab_size", "hidden_size", "intermediate_size")} == {
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 256,
    }
    assert (config["num_hidden_layers"], config["num_attention_heads"]) == (2, 2)
    assert (config["num_key_value_heads"], config["head_dim"]) == (1, 64)
    assert config["max_position_embeddings"] == 4096 and config["tie_word_embeddings"]
    assert config["dtype"] == "bfloat16"


def test_its_tokenizer_round_trips_text_with_eos_as_pad(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    assert tok.eos_token == tok.pad_token == EOS
    assert len(tok) == 512
    text = "The quick brown fox: 1024 tokens/s!"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_the_build_is_deterministic(tiny_model, tmp_path):
    assert main(["tiny-model", str(tmp_path / "again")]) == 0
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        assert (tmp_path / "again" / name).read_bytes() == (tiny_model / name).read_bytes(), name


def test_it_refuses_to_overwrite_a_model(tiny_model):
    with pytest.raises(FileExistsError, match="already holds a model"):
        build(tiny_model)
