"""One trainable part replica (a relay stage, or a data holder's head+tail): gradients, step, state.

Owns the flat gradient buffer (every parameter's ``.grad`` is a view into one flat tensor that
receives one backward call's gradient at a time), the exact fixed-point sum of the iteration's
microbatch gradients and their count, the aggregation step (reduce -> squared norm -> clip by the
global or the part's own norm -> AdamW, identical on every replica given the same inputs) and state
bytes / hashes. Forward/backward bookkeeping lives in the executors that extend it.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gwtfp2p.config import RunSpec
from gwtfp2p.model import state
from gwtfp2p.model.aggregate import GradContribution, make_optimizer, mean_gradient
from gwtfp2p.model.fixedpoint import FixedPointSum
from gwtfp2p.model.gradnorm import clip_scale, sq_norm

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    """What one aggregation step did on this replica."""

    count: int  # microbatches in the mean (over all replicas)
    grad_norm: float  # L2 norm of this part's mean gradient before clipping (0 when count == 0)
    clipped: bool
    stepped: bool  # False when count == 0 or the (global, in global mode) gradient was not finite
    dropped_pending: int  # microbatches still waiting for backward, discarded at the boundary
    state_hash: str
    clip_norm: float = 0.0  # the norm the clip used: the whole model's (global) or this part's
    clip_scale: float = 1.0  # the factor the mean gradient was multiplied by (1.0: not clipped)


class Trainable:
    """A module replica with its AdamW optimizer and the iteration's exact gradient sum and count."""

    def __init__(self, module: nn.Module, spec: RunSpec, kind: str) -> None:
        self.module = module
        self.spec = spec
        self.kind = kind
        self.params: list[nn.Parameter] = list(module.parameters())
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1:
            raise ValueError(f"{kind}: all parameters must share one dtype, got {dtypes}")
        self.grad_dtype = dtypes.pop()
        self.numel = sum(p.numel() for p in self.params)
        starts = itertools.accumulate((p.numel() for p in self.params[:-1]), initial=0)
        self._offsets = {id(p): start for p, start in zip(self.params, starts, strict=True)}  # in the flat
        self._flat = torch.zeros(self.numel, dtype=self.grad_dtype, device=self.params[0].device)
        self._sum = FixedPointSum(self.numel, self._flat.device)
        self._bind_grads()
        self.optimizer = make_optimizer(self.params, spec)
        self.count = 0
        self._sq_cache: tuple[torch.Tensor, int, float] | None = None

    def _bind_grads(self) -> None:
        offset = 0
        for p in self.params:
            p.grad = self._flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()

    def _check_grads_bound(self) -> None:
        offset = 0
        for p in self.params:
            if p.grad is None or p.grad.data_ptr() != self._flat[offset:].data_ptr():
                raise RuntimeError(f"{self.kind}: a gradient left the flat buffer (was zero_grad called?)")
            offset += p.numel()

    def _fold(self, params: Sequence[nn.Parameter] | None = None) -> None:
        """Move what the last backward call left in the flat buffer into the exact sum; zero the buffer.

        ``params`` limits this to those parameters (the caller knows the others' gradients are zero).
        """
        self._check_grads_bound()
        if params is None:
            self._sum.add(self._flat)
            self._flat.zero_()
            return
        for p in params:
            self._sum.add(p.grad.reshape(-1), start=self._offsets[id(p)])
            p.grad.zero_()

    def _fold_rows(self, param: nn.Parameter, rows: torch.Tensor) -> None:
        """Move rows ``rows`` (distinct) of a matrix parameter's gradient into the exact sum; zero them.
        The caller knows its other rows are zero (an embedding's gradient touches its inputs' rows)."""
        grad = param.grad
        self._sum.add_rows(self._offsets[id(param)], tuple(grad.shape), rows, grad.index_select(0, rows))
        grad.index_fill_(0, rows, 0.0)

    def _grad_views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """``flat`` cut into one view per parameter (the canonical order)."""
        return list(flat.split([p.numel() for p in self.params]))

    # -- aggregation -------------------------------------------------------------------------------
    def grad_contribution(self, replica_id: str) -> GradContribution:
        """This replica's exact gradient sum (int64 fixed point, on the CPU) and microbatch count."""
        self._finish_backward()
        total = self._sum.total.detach().to("cpu", copy=True)
        return GradContribution(replica_id, total, self.count, self._sum.bound)

    def _finish_backward(self) -> None:
        """Executors fold gradients still held back (e.g. a tail without its head) here."""

    def reduce(self, contributions: Sequence[GradContribution]) -> tuple[torch.Tensor, int]:
        """(mean gradient, count) of the part from all live replicas' contributions, in any order.

        The mean is flat, of the parameters' dtype, on the CPU: bitwise the same on every replica
        and for any split of the microbatches over replicas.
        """
        return mean_gradient(contributions, numel=self.numel, dtype=self.grad_dtype)

    def grad_sq_norm(self, mean_grad: torch.Tensor) -> float:
        """This part's squared L2 norm of ``mean_grad`` (the same bits on every machine).

        In ``clip_mode="global"`` every part sends it to every other part; the sum of all parts'
        (``gradnorm.global_sq_norm``) is the ``total_sq_norm`` each part then steps with.
        """
        if mean_grad.dim() != 1 or mean_grad.numel() != self.numel:
            raise ValueError(f"{self.kind}: mean gradient must be flat with {self.numel} elements")
        cached = self._sq_cache
        if cached is not None and cached[0] is mean_grad and cached[1] == mean_grad._version:
            return cached[2]
        value = sq_norm(self._grad_views(mean_grad))
        self._sq_cache = (mean_grad, mean_grad._version, value)  # apply_mean asks again for the same mean
        return value

    def apply_step(self, contributions: Sequence[GradContribution], *,
                   total_sq_norm: float | None = None) -> StepResult:
        """``reduce`` then ``apply_mean`` (see there for ``total_sq_norm``)."""
        mean, count = self.reduce(contributions)
        return self.apply_mean(mean, count, total_sq_norm=total_sq_norm)

    def apply_mean(self, mean_grad: torch.Tensor, count: int, *, total_sq_norm: float | None = None) -> StepResult:
        """Clip the iteration's mean gradient, take one AdamW step, and start a new iteration.

        ``total_sq_norm`` is the whole model's squared norm (required in ``clip_mode="global"``; a
        replayed step passes the logged one); in ``"per_part"`` mode it must be None and the part's
        own norm is used. A zero ``count`` (no microbatch reached this part) or a non-finite norm
        takes no step.
        """
        own_sq = self.grad_sq_norm(mean_grad)
        clip_sq = self._clip_sq_norm(own_sq, total_sq_norm)
        self._check_grads_bound()
        self._flat.copy_(mean_grad.to(self._flat.device))
        scale, stepped = 1.0, False
        if count > 0 and math.isfinite(clip_sq):
            scale = clip_scale(clip_sq, self.spec.grad_clip)
            if scale < 1.0:
                self._flat.mul_(torch.tensor(scale, dtype=self._flat.dtype, device=self._flat.device))
            self.optimizer.step()
            stepped = True
        elif count > 0:
            log.warning("%s: non-finite gradient (squared norm %s); step skipped", self.kind, clip_sq)
        dropped = self.discard_gradients()
        norm = math.sqrt(own_sq) if count > 0 else 0.0
        return StepResult(count, norm, scale < 1.0, stepped, dropped, self.state_hash(),
                          math.sqrt(clip_sq) if count > 0 else 0.0, scale)

    def discard_gradients(self) -> int:
        """Forget the gradients gathered since the last step and the iteration's pending microbatches
        (the state was replaced by a replica's: they belong to an iteration this part no longer steps).
        Returns the discarded pending microbatches."""
        self._flat.zero_()
        self._sum.clear()
        self.count = 0
        self._sq_cache = None
        return self._end_iteration()

    def _clip_sq_norm(self, own_sq: float, total_sq_norm: float | None) -> float:
        if self.spec.clip_mode == "per_part":
            if total_sq_norm is not None:
                raise ValueError(f"{self.kind}: clip_mode 'per_part' clips by the part's own norm; "
                                 "pass no total_sq_norm")
            return own_sq
        if total_sq_norm is None:
            raise ValueError(f"{self.kind}: clip_mode 'global' needs total_sq_norm, the sum of every "
                             "part's grad_sq_norm for this iteration")
        total = float(total_sq_norm)
        if total < own_sq:  # an exact sum of norms that include ours cannot be smaller (NaN passes)
            raise ValueError(f"{self.kind}: total_sq_norm {total!r} is below this part's own {own_sq!r}; "
                             "it must include every part's grad_sq_norm, this one too")
        return total

    def _end_iteration(self) -> int:
        """Executors drop per-iteration bookkeeping here; returns the discarded pending microbatches."""
        return 0

    # -- state -------------------------------------------------------------------------------------
    def state_bytes(self) -> bytes:
        """Weights and optimizer state as bytes (with their hash inside), for a joining replica."""
        return state.dump_state(self.kind, self.module, self.optimizer)

    def load_state_bytes(self, data: bytes, expected_hash: str | None = None) -> str:
        """Replace weights and optimizer state by ``data``; verifies and returns the state hash."""
        digest = state.load_state(data, self.kind, self.module, self.optimizer, expected_hash)
        self._bind_grads()
        return digest

    def state_hash(self) -> str:
        """Short hex hash of weights + optimizer state; replicas in sync have equal hashes."""
        return state.state_hash(self.module, self.optimizer)

    def weights_hash(self) -> str:
        """Short hex hash of the weights alone."""
        return state.weights_hash(self.module)

    def parameter_bytes(self) -> int:
        """Bytes held by weights, gradients and the two AdamW moments (4 copies of the parameters),
        plus the int64 exact gradient sum (8 bytes per parameter)."""
        return 4 * self.numel * self._flat.element_size() + self._sum.total.numel() * self._sum.total.element_size()
