"""Single-process reference training of the unsplit transformers model (the parity target).

Owns one training iteration of the whole ``GPT2LMHeadModel``/``LlamaForCausalLM`` with the swarm's
arithmetic: each microbatch's mean token loss is backpropagated alone, its gradient enters an exact
fixed-point sum (``fixedpoint.py``), the mean is that sum over the number of microbatches, clipped
by the whole model's norm (``"global"``, what a single process does) or by each pipeline part's own
(``"per_part"``), and AdamW takes one step per part (the same single-tensor recipe as the parts).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel

from gwtfp2p.config import CLIP_MODES, RunSpec
from gwtfp2p.model.aggregate import make_optimizer
from gwtfp2p.model.build import build_from_spec
from gwtfp2p.model.fixedpoint import FixedPointSum, to_float
from gwtfp2p.model.gradnorm import clip_scale, global_sq_norm, sq_norm
from gwtfp2p.model.partition import split_model


class ReferenceTrainer:
    """The unsplit model, trained one iteration (a list of microbatches) at a time."""

    def __init__(self, spec: RunSpec, vocab_size: int | None = None, *, clip: str | None = None,
                 dropout: float = 0.0, model: PreTrainedModel | None = None) -> None:
        clip = spec.clip_mode if clip is None else clip
        if clip not in CLIP_MODES:
            raise ValueError(f"clip must be one of {CLIP_MODES}, got {clip!r}")
        self.spec = spec
        self.clip = clip
        self.model = model if model is not None else build_from_spec(spec, vocab_size, dropout=dropout)
        self.parts = split_model(self.model, spec.n_stages, spec.partition)
        self.groups = self.parts.groups()
        self.optimizers = [make_optimizer(group, spec) for group in self.groups]
        self.params = [p for group in self.groups for p in group]
        self.last_clip_scales: list[float] = []  # per part, of the last step

    def step(self, microbatches: Sequence[torch.Tensor]) -> list[float]:
        """Train on ``microbatches`` (each [B,T] token ids, labels = inputs); returns their losses."""
        exact = FixedPointSum(sum(p.numel() for p in self.params))
        losses = []
        for ids in microbatches:
            for p in self.params:
                p.grad = None
            out = self.model(input_ids=ids, labels=ids, use_cache=False)
            out.loss.backward()
            losses.append(float(out.loss.detach()))
            exact.add(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                                 for p in self.params]))
        if not exact.representable:
            raise FloatingPointError("reference: a gradient was not finite or beyond the fixed-point range")
        mean = to_float(exact.total, len(microbatches))
        for p, g in zip(self.params, mean.split([p.numel() for p in self.params]), strict=True):
            p.grad = g.view_as(p).clone()
        part_sq = [sq_norm(p.grad for p in group) for group in self.groups]
        total = global_sq_norm(part_sq)
        self.last_clip_scales = []
        for group, own, optimizer in zip(self.groups, part_sq, self.optimizers, strict=True):
            scale = clip_scale(total if self.clip == "global" else own, self.spec.grad_clip)
            self.last_clip_scales.append(scale)
            for p in group:
                p.grad.mul_(torch.tensor(scale, dtype=p.grad.dtype))
            optimizer.step()
        return losses
