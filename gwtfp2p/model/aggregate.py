"""Aggregation math: replicas' (gradient sum, microbatch count) -> mean -> clip -> AdamW step.

Owns the canonical reduction order (contributions sorted by replica id, summed one after the
other into a fresh tensor, so every replica that reduces the same inputs gets the same bits), the
optimizer recipe (AdamW; weight decay on matrices and embeddings only) and the clipping rule (the
global L2 norm of one part's mean gradient, via ``torch.nn.utils.clip_grad_norm_``). It does not
gather contributions over the network; the daemon does and passes them in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gwtfp2p.config import RunSpec


class AggregationError(ValueError):
    """Contributions are inconsistent (duplicate replica ids, wrong shape/dtype, negative count)."""


@dataclass(frozen=True)
class GradContribution:
    """One replica's gradient sum over its microbatches this iteration (flat, canonical order)."""

    replica_id: str
    grad_sum: torch.Tensor
    count: int


def reduce_contributions(contributions: Sequence[GradContribution], *, numel: int,
                         dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """(Σ grad_sum, Σ count) in replica-id order; validates every contribution (network data)."""
    ordered = sorted(contributions, key=lambda c: c.replica_id)
    ids = [c.replica_id for c in ordered]
    if len(set(ids)) != len(ids):
        raise AggregationError(f"duplicate replica ids in aggregation: {ids}")
    total = torch.zeros(numel, dtype=dtype)
    count = 0
    for c in ordered:
        g = c.grad_sum
        if not isinstance(g, torch.Tensor) or g.dtype != dtype or g.dim() != 1 or g.numel() != numel:
            raise AggregationError(f"replica {c.replica_id}: gradient must be a flat {dtype} tensor of "
                                   f"{numel} elements")
        if not isinstance(c.count, int) or c.count < 0:
            raise AggregationError(f"replica {c.replica_id}: count must be an integer >= 0, got {c.count!r}")
        if total.device != g.device:
            total = total.to(g.device)
        total.add_(g)
        count += c.count
    return total, count


def mean_gradient(contributions: Sequence[GradContribution], *, numel: int,
                  dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """The iteration's mean gradient (sum / count) and count; a zero count gives a zero gradient."""
    total, count = reduce_contributions(contributions, numel=numel, dtype=dtype)
    if count > 0:
        total.div_(count)
    return total, count


def make_optimizer(params: Iterable[nn.Parameter], spec: RunSpec) -> torch.optim.AdamW:
    """AdamW over ``params`` with the run's hyper-parameters; no decay on biases and norm gains.

    The single-tensor (for-loop) implementation is pinned so that every replica on the same kind
    of device runs the same arithmetic.
    """
    params = list(params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": spec.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.lr, betas=(spec.beta1, spec.beta2), eps=spec.adam_eps,
                             foreach=False)


def clip_gradients(params: Sequence[nn.Parameter], max_norm: float) -> float:
    """Scale the params' gradients so that their global L2 norm is at most ``max_norm``.

    Returns the norm before clipping (``inf``/``nan`` if the gradient is not finite).
    """
    norm = nn.utils.clip_grad_norm_(params, max_norm, foreach=False)
    return float(norm)
