"""A data holder's bookkeeping of one iteration, and the unit assignment of its microbatches.

Pure (no I/O): which microbatch went over which flow unit, which came back with a loss (tail
done) and which finished its backward (head done); the iteration is closed when every
microbatch's head backward is done; its losses add up exactly (``LossSum``). ``assign_units``
spreads F_d microbatches over the data holder's complete flow units round-robin (reusing units
when there are fewer than F_d).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gwtfp2p.model.losssum import LossSum

U = TypeVar("U")


def assign_units(units: Sequence[U], n_microbatches: int) -> list[U]:
    """Unit of each microbatch index (round-robin); empty when there is no unit."""
    if not units:
        return []
    return [units[i % len(units)] for i in range(n_microbatches)]


@dataclass
class MicrobatchState:
    index: int
    unit: str = ""
    first_hop: str = ""
    loss: float | None = None
    head_done: bool = False


@dataclass
class IterationLedger:
    """The microbatches of one iteration of one data holder."""

    iteration: int
    n_microbatches: int
    states: dict[int, MicrobatchState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.states = {i: MicrobatchState(i) for i in range(self.n_microbatches)}

    def sent(self, index: int, unit: str, first_hop: str) -> None:
        state = self.states[index]
        state.unit, state.first_hop = unit, first_hop

    def tail_done(self, index: int, loss: float) -> bool:
        """Record the loss; False if it was already known (a duplicate)."""
        state = self.states.get(index)
        if state is None or state.loss is not None:
            return False
        state.loss = loss
        return True

    def head_done(self, index: int) -> bool:
        """Record the finished backward; False if unknown or already done."""
        state = self.states.get(index)
        if state is None or state.head_done:
            return False
        state.head_done = True
        return True

    @property
    def closed(self) -> bool:
        return all(s.head_done for s in self.states.values())

    @property
    def done(self) -> int:
        return sum(1 for s in self.states.values() if s.head_done)

    def losses(self) -> dict[int, float]:
        return {i: s.loss for i, s in sorted(self.states.items()) if s.loss is not None}

    def loss_sum(self) -> LossSum:
        """The exact sum of the recorded losses (the same whatever order they came back in)."""
        return LossSum.of(self.losses().values())
