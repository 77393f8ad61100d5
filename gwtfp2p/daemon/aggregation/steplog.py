"""The last few optimizer steps of a part, kept so that a joining replica can replay them.

A replica records, for each step it takes, the iteration, the mean gradient it applied (on the CPU),
the microbatch count, the whole model's squared norm it clipped by and the state hash after the
step. A newcomer whose downloaded state fell behind while it was downloading fetches the missing steps
(``steps_wire.encode_steps``) and applies them with ``Trainable.apply_mean``: the same arithmetic as the
replicas, so the same bits, checked against each step's hash. Owns the ring of steps (its length:
``replay_capacity``), no I/O.
"""

from __future__ import annotations

from collections import deque

import torch

from gwtfp2p.daemon.steps_wire import LoggedStep

MAX_KEPT_STEPS = 256  # whatever the budget: a replay of more is slower than a fresh download


def replay_capacity(min_steps: int, budget_bytes: int, numel: int) -> int:
    """How many steps a part of ``numel`` parameters keeps: at least ``min_steps`` (0: none at all), more
    while their mean gradients (4 bytes a parameter) fit in ``budget_bytes``, at most ``MAX_KEPT_STEPS``.
    A small model steps several times during one state download; a large one's few steps fill RAM."""
    if min_steps <= 0:
        return 0
    return max(min_steps, min(MAX_KEPT_STEPS, budget_bytes // max(4 * numel, 1)))


class StepLog:
    """A ring of the last ``capacity`` steps (``capacity`` 0: none kept)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._steps: deque[LoggedStep] = deque(maxlen=max(capacity, 1))

    def record(self, iteration: int, mean_grad: torch.Tensor, count: int, state_hash: str,
               total_sq_norm: float | None = None) -> None:
        if self.capacity <= 0:
            return
        if self._steps and self._steps[-1].iteration != iteration - 1:
            self._steps.clear()  # a gap (we rejoined): older steps cannot be replayed in a row
        self._steps.append(LoggedStep(iteration, mean_grad.detach().to("cpu", copy=True), count, state_hash,
                                      total_sq_norm))

    def since(self, iteration: int) -> list[LoggedStep] | None:
        """The steps of iterations ``iteration``, ``iteration + 1``, … up to the latest; None if some
        of them are no longer (or not) kept. An empty list: nothing to replay."""
        if self.capacity <= 0 or not self._steps:
            return None
        if iteration == self._steps[-1].iteration + 1:
            return []
        first = self._steps[0].iteration
        if iteration < first or iteration > self._steps[-1].iteration:
            return None
        return list(self._steps)[iteration - first:]
