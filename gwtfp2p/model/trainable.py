"""One trainable part replica (a relay stage, or a data holder's head+tail): gradients, step, state.

Owns the flat gradient buffer (every parameter's ``.grad`` is a view into one flat tensor, so the
replica's gradient sum leaves and returns without copies per tensor), the microbatch count, the
aggregation step (mean -> clip -> AdamW, identical on every replica given the same inputs) and
state bytes / hashes. Forward/backward bookkeeping lives in the executors that extend it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from gwtfp2p.config import RunSpec
from gwtfp2p.model import state
from gwtfp2p.model.aggregate import GradContribution, clip_gradients, make_optimizer, mean_gradient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    """What one aggregation step did on this replica."""

    count: int  # microbatches in the mean (over all replicas)
    grad_norm: float  # L2 norm of the mean gradient before clipping (0 when count == 0)
    clipped: bool
    stepped: bool  # False when count == 0 or the gradient was not finite
    dropped_pending: int  # microbatches still waiting for backward, discarded at the boundary
    state_hash: str


class Trainable:
    """A module replica with its AdamW optimizer and the iteration's gradient sum and count."""

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
        self._flat = torch.zeros(self.numel, dtype=self.grad_dtype, device=self.params[0].device)
        self._bind_grads()
        self.optimizer = make_optimizer(self.params, spec)
        self.count = 0

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

    # -- aggregation -------------------------------------------------------------------------------
    def grad_contribution(self, replica_id: str) -> GradContribution:
        """A copy of this replica's gradient sum and microbatch count, for the all-reduce."""
        self._check_grads_bound()
        return GradContribution(replica_id, self._flat.detach().clone(), self.count)

    def apply_step(self, contributions: Sequence[GradContribution]) -> StepResult:
        """Reduce all live replicas' contributions (any order; sorted by id here) and step."""
        mean, count = mean_gradient(contributions, numel=self.numel, dtype=self.grad_dtype)
        return self.apply_mean(mean, count)

    def apply_mean(self, mean_grad: torch.Tensor, count: int) -> StepResult:
        """Clip the iteration's mean gradient, take one AdamW step, and start a new iteration.

        A zero ``count`` (no microbatch reached this part) or a non-finite gradient takes no step.
        """
        self._check_grads_bound()
        self._flat.copy_(mean_grad.to(self._flat.device))
        norm, clipped, stepped = 0.0, False, False
        if count > 0:
            norm = clip_gradients(self.params, self.spec.grad_clip)
            if math.isfinite(norm):
                clipped = norm > self.spec.grad_clip
                self.optimizer.step()
                stepped = True
            else:
                log.warning("%s: non-finite mean gradient (norm %s); step skipped", self.kind, norm)
        self._flat.zero_()
        self.count = 0
        dropped = self._end_iteration()
        return StepResult(count, norm, clipped, stepped, dropped, self.state_hash())

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
        """Bytes held by weights, gradients and the two AdamW moments (4 copies of the parameters)."""
        return 4 * self.numel * self._flat.element_size()
