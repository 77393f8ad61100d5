"""Build a whole transformers causal LM from a preset with a seeded initialization (no download).

Owns the seeding rule (the global torch RNG is forked, so building never disturbs the caller's
random state) and the check that a run's sequence length fits the preset. It does not split the
model (``partition.py``). Every node of a run builds the same initial weights from the same seed.
"""

from __future__ import annotations

import torch
from transformers import GPT2LMHeadModel, LlamaForCausalLM, PreTrainedModel

from gwtfp2p.config import ConfigError, RunSpec
from gwtfp2p.model.presets import get_preset, model_config
from gwtfp2p.model.tokenizer import run_vocab_size


def build_model(family: str, preset: str, vocab_size: int, *, seed: int, dropout: float = 0.0,
                eos_token_id: int | None = None, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The unsplit model (``GPT2LMHeadModel`` or ``LlamaForCausalLM``) initialized from ``seed``.

    The model is in training mode; GPT-2's ``lm_head.weight`` is the same Parameter as ``wte.weight``.
    """
    config = model_config(family, preset, vocab_size, dropout=dropout, eos_token_id=eos_token_id)
    cls = GPT2LMHeadModel if family == "gpt2" else LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model.loss_type = "ForCausalLM"
    model.to(dtype=dtype)
    model.train()
    return model


def build_from_spec(spec: RunSpec, vocab_size: int | None = None, *, dropout: float = 0.0,
                    eos_token_id: int | None = None) -> PreTrainedModel:
    """``build_model`` for a run spec; checks that ``spec.seq_len`` fits the preset's positions.

    ``vocab_size`` defaults to the run's (``spec.vocab_size``, or 257 for the byte tokenizer).
    """
    shape = get_preset(spec.model_family, spec.model_preset)
    if spec.seq_len > shape.max_positions:
        raise ConfigError(f"--seq-len: {spec.seq_len} exceeds the {spec.model_family}/{spec.model_preset} "
                          f"preset's {shape.max_positions} positions; use a shorter sequence")
    vocab = vocab_size if vocab_size is not None else run_vocab_size(spec)
    return build_model(spec.model_family, spec.model_preset, vocab, seed=spec.seed, dropout=dropout,
                       eos_token_id=eos_token_id)
