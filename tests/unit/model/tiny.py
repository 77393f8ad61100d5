"""Tiny run specs and random token batches shared by the model tests."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gwtfp2p.config import RunSpec

VOCAB = 257  # the byte tokenizer's vocabulary


def tiny_spec(family: str = "gpt2", n_stages: int = 2, **overrides) -> RunSpec:
    """A tiny run spec: short sequences, small microbatches."""
    fields = {"model_family": family, "model_preset": "tiny", "n_stages": n_stages, "seed": 7,
              "seq_len": 12, "microbatch_size": 2, "lr": 1e-3, "grad_clip": 1.0}
    fields.update(overrides)
    return RunSpec(**fields)


def random_batches(per_dh: Sequence[int], seed: int, spec: RunSpec) -> dict[int, list[torch.Tensor]]:
    """Random token microbatches: ``per_dh[d]`` of them for data holder ``d``."""
    gen = torch.Generator().manual_seed(seed)
    shape = (spec.microbatch_size, spec.seq_len)
    return {d: [torch.randint(0, VOCAB, shape, generator=gen) for _ in range(n)]
            for d, n in enumerate(per_dh)}
