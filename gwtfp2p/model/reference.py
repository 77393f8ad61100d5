"""Single-process reference training of the unsplit transformers model (the parity target).

Owns one training iteration of the whole ``GPT2LMHeadModel``/``LlamaForCausalLM``: each
microbatch's mean token loss is backpropagated, the summed gradient is divided by the number of
microbatches, clipped, and AdamW takes one step. Clipping is ``"per_part"`` (each of the pipeline's
parts - data holder head+tail, stage 1..S - clipped by its own norm, which is what the pipeline does)
or ``"global"`` (one norm over the whole model, what unsplit training usually does).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from gwtfp2p.config import RunSpec
from gwtfp2p.model.aggregate import clip_gradients, make_optimizer
from gwtfp2p.model.build import build_from_spec
from gwtfp2p.model.partition import split_model

CLIP_MODES = ("per_part", "global")


class ReferenceTrainer:
    """The unsplit model, trained one iteration (a list of microbatches) at a time."""

    def __init__(self, spec: RunSpec, vocab_size: int | None = None, *, clip: str = "per_part",
                 dropout: float = 0.0, model: PreTrainedModel | None = None) -> None:
        if clip not in CLIP_MODES:
            raise ValueError(f"clip must be one of {CLIP_MODES}, got {clip!r}")
        self.spec = spec
        self.clip = clip
        self.model = model if model is not None else build_from_spec(spec, vocab_size, dropout=dropout)
        self.parts = split_model(self.model, spec.n_stages, spec.partition)
        self.groups = self.parts.groups()
        self.optimizers = [make_optimizer(group, spec) for group in self.groups]
        self.params = [p for group in self.groups for p in group]

    def step(self, microbatches: Sequence[torch.Tensor]) -> list[float]:
        """Train on ``microbatches`` (each [B,T] token ids, labels = inputs); returns their losses."""
        for p in self.params:
            p.grad = None
        losses = []
        for ids in microbatches:
            out = self.model(input_ids=ids, labels=ids, use_cache=False)
            out.loss.backward()
            losses.append(float(out.loss.detach()))
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.div_(len(microbatches))
        if self.clip == "per_part":
            for group in self.groups:
                clip_gradients(group, self.spec.grad_clip)
        else:
            clip_gradients(self.params, self.spec.grad_clip)
        for optimizer in self.optimizers:
            optimizer.step()
        return losses
