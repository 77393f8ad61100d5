"""Aggregation math: replicas' exact (gradient sum, count) -> the part's mean gradient; AdamW recipe.

Owns the contribution a replica sends (its microbatches' gradients summed exactly in fixed point,
``fixedpoint.py``), its validation (contributions come from the network), the reduction (integer
sums: the same bits whatever the arrival order or the split of microbatches over replicas) and
the mean, and the optimizer recipe (AdamW; weight decay on matrices and embeddings only). It does
not gather contributions over the network (the daemon does) and does not clip (``gradnorm.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gwtfp2p.config import RunSpec
from gwtfp2p.model.fixedpoint import BOUND_LIMIT, add_bounds, to_float


class AggregationError(ValueError):
    """Contributions are inconsistent (duplicate replica ids, wrong shape/dtype, bad count/bound)."""


@dataclass(frozen=True)
class GradContribution:
    """One replica's gradient sum over its microbatches this iteration.

    ``grad_sum`` is flat int64 fixed point (units of ``2**-FRACTION_BITS``, parameters in the part's
    canonical order); ``bound`` is the sum of each added microbatch gradient's largest magnitude in
    those units (``BOUND_LIMIT``: some gradient was not finite or too large).
    """

    replica_id: str
    grad_sum: torch.Tensor
    count: int
    bound: int = 0


def _check(c: GradContribution, numel: int) -> None:
    g = c.grad_sum
    if not isinstance(g, torch.Tensor) or g.dtype != torch.int64 or g.dim() != 1 or g.numel() != numel:
        raise AggregationError(f"replica {c.replica_id}: gradient must be a flat int64 (fixed-point) tensor "
                               f"of {numel} elements")
    for name, value in (("count", c.count), ("bound", c.bound)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise AggregationError(f"replica {c.replica_id}: {name} must be an integer >= 0, got {value!r}")
    if c.bound > BOUND_LIMIT:
        raise AggregationError(f"replica {c.replica_id}: bound {c.bound} exceeds {BOUND_LIMIT}")
    if c.bound < BOUND_LIMIT and numel:
        low, high = torch.aminmax(g)
        if max(-int(low), int(high)) > c.bound:
            raise AggregationError(f"replica {c.replica_id}: gradient values exceed the bound it sent")


def reduce_contributions(contributions: Sequence[GradContribution], *,
                         numel: int) -> tuple[torch.Tensor, int, int]:
    """(Σ grad_sum, Σ count, Σ bound): exact integer sums, on the CPU; validates every contribution."""
    ids = [c.replica_id for c in contributions]
    if len(set(ids)) != len(ids):
        raise AggregationError(f"duplicate replica ids in aggregation: {sorted(ids)}")
    total: torch.Tensor | None = None
    count, bound = 0, 0
    for c in contributions:
        _check(c, numel)
        if total is None:
            total = c.grad_sum.to("cpu", copy=True)
        else:
            total.add_(c.grad_sum.to("cpu"))
        count += c.count
        bound = add_bounds(bound, c.bound)
    return (torch.zeros(numel, dtype=torch.int64) if total is None else total), count, bound


def mean_gradient(contributions: Sequence[GradContribution], *, numel: int,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, int]:
    """The iteration's mean gradient (exact sum / count, rounded once per element) and count.

    A zero count gives a zero gradient; an unrepresentable sum (non-finite or too large gradients)
    gives a NaN-filled one, so that the step is skipped as for any non-finite gradient.
    """
    total, count, bound = reduce_contributions(contributions, numel=numel)
    if count == 0:
        return torch.zeros(numel, dtype=dtype), 0
    if bound >= BOUND_LIMIT:
        return torch.full((numel,), float("nan"), dtype=dtype), count
    return to_float(total, count, dtype), count


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
