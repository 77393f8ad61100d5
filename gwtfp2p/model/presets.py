"""Model presets: named GPT-2 and Llama shapes, from tiny (tests on CPU) to ~500M parameters.

Owns the table of shapes and the translation of (family, preset, vocabulary size, dropout) into a
transformers config object. It does not build weights (``build.py``) or split models
(``partition.py``). Parameter counts are in docs/model.md (``count_parameters`` computes them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PretrainedConfig

from gwtfp2p.config import MODEL_FAMILIES, ConfigError


@dataclass(frozen=True)
class Preset:
    """One model shape. ``native_vocab`` is the vocabulary of the family's usual BPE tokenizer."""

    n_layers: int
    hidden: int
    heads: int
    max_positions: int
    intermediate: int = 0  # llama only (gpt2 uses 4 * hidden)
    kv_heads: int = 0  # llama only; 0 means heads (no grouped-query attention)
    native_vocab: int = 50257


PRESETS: dict[str, dict[str, Preset]] = {
    "gpt2": {
        "tiny": Preset(n_layers=4, hidden=32, heads=4, max_positions=256),
        "small": Preset(n_layers=6, hidden=128, heads=4, max_positions=512),
        "124m": Preset(n_layers=12, hidden=768, heads=12, max_positions=1024),
        "500m": Preset(n_layers=24, hidden=1280, heads=20, max_positions=1024),
    },
    "llama": {
        "tiny": Preset(n_layers=4, hidden=32, heads=4, kv_heads=2, intermediate=64, max_positions=256,
                       native_vocab=32000),
        "small": Preset(n_layers=6, hidden=128, heads=4, kv_heads=2, intermediate=344, max_positions=512,
                        native_vocab=32000),
        "124m": Preset(n_layers=12, hidden=768, heads=12, intermediate=2048, max_positions=2048,
                       native_vocab=32000),
        "500m": Preset(n_layers=24, hidden=1280, heads=20, kv_heads=4, intermediate=4096,
                       max_positions=2048, native_vocab=32000),
    },
}


def get_preset(family: str, preset: str) -> Preset:
    """The named preset, or ``ConfigError`` naming the flag to fix."""
    if family not in MODEL_FAMILIES:
        raise ConfigError(f"--model-family: must be one of {', '.join(MODEL_FAMILIES)}, got {family!r}")
    table = PRESETS[family]
    if preset not in table:
        raise ConfigError(f"--model-preset: unknown {family} preset {preset!r}; "
                          f"choose one of {', '.join(table)}")
    return table[preset]


def model_config(family: str, preset: str, vocab_size: int, *, dropout: float = 0.0,
                 eos_token_id: int | None = None) -> PretrainedConfig:
    """A transformers config for ``family``/``preset`` with the tokenizer's ``vocab_size``.

    Dropout is 0 by default (recompute-safe without any seeding); a positive ``dropout`` is applied to
    every dropout site of the family and is seeded per (microbatch, stage) by the executors.
    """
    shape = get_preset(family, preset)
    if not (isinstance(vocab_size, int) and vocab_size >= 2):
        raise ConfigError(f"--tokenizer: vocabulary size must be an integer >= 2, got {vocab_size!r}")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"--dropout: must be within [0, 1), got {dropout!r}")
    eos = vocab_size - 1 if eos_token_id is None else eos_token_id
    if family == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_positions=shape.max_positions, n_embd=shape.hidden,
                          n_layer=shape.n_layers, n_head=shape.heads, resid_pdrop=dropout,
                          embd_pdrop=dropout, attn_pdrop=dropout, bos_token_id=eos, eos_token_id=eos,
                          tie_word_embeddings=True)
    return LlamaConfig(vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                       num_hidden_layers=shape.n_layers, num_attention_heads=shape.heads,
                       num_key_value_heads=shape.kv_heads or shape.heads,
                       max_position_embeddings=shape.max_positions, attention_dropout=dropout,
                       bos_token_id=eos, eos_token_id=eos, pad_token_id=None, tie_word_embeddings=False)


def config_dropout(config: PretrainedConfig) -> float:
    """The largest dropout probability a config applies anywhere (0 means deterministic forward)."""
    names = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout")
    return max(float(getattr(config, name, 0.0) or 0.0) for name in names)


def count_parameters(family: str, preset: str, vocab_size: int | None = None) -> int:
    """Number of distinct parameters (tied weights counted once), computed on the meta device."""
    shape = get_preset(family, preset)
    config = model_config(family, preset, vocab_size or shape.native_vocab)
    cls = GPT2LMHeadModel if family == "gpt2" else LlamaForCausalLM
    with torch.device("meta"):
        model = cls(config)
    return sum(p.numel() for p in model.parameters())
