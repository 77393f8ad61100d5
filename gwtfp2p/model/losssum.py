"""Exact sums of per-microbatch losses: the same total whatever the order or the data holder split.

Owns ``LossSum``: a sum of floats kept exactly as a few non-overlapping float partials (each
addition is an error-free transformation: the rounded sum and its exact rounding error), merged
across data holders by adding partials, and read out as the correctly rounded exact total
(``math.fsum``). The partials travel as a list of floats; ``from_parts`` validates them (network
data). Non-finite losses are kept apart (inf/nan arithmetic is order-free) and poison the total.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MAX_PARTIALS = 64  # partials of finite float64 sums never exceed ~40; more means hostile input


def _add_exact(partials: list[float], x: float) -> list[float]:
    """Add ``x`` to non-overlapping ``partials`` exactly; returns the new partials (smallest first)."""
    out = []
    for y in partials:
        big, small = (x, y) if abs(x) >= abs(y) else (y, x)
        rounded = big + small
        if not math.isfinite(rounded):
            raise OverflowError("loss sum beyond the float range")
        error = small - (rounded - big)  # exact when |big| >= |small| (Dekker's fast two-sum)
        if error:
            out.append(error)
        x = rounded
    out.append(x)
    return out


def _accumulate(partials: list[float], nonfinite: float, x: float) -> tuple[list[float], float]:
    """Add ``x``: exactly to the partials if finite, else (and on overflow) to the non-finite part."""
    if not math.isfinite(x):
        return partials, nonfinite + x
    try:
        return _add_exact(partials, x), nonfinite
    except OverflowError:  # beyond the float range: the total is +-inf from now on
        return partials, nonfinite + math.copysign(math.inf, x)


@dataclass(frozen=True)
class LossSum:
    """The exact sum of ``count`` losses (``partials`` add up to it exactly) plus non-finite ones."""

    partials: tuple[float, ...] = ()
    count: int = 0
    nonfinite: float = 0.0  # the (order-free) sum of the inf/nan losses; 0.0 when there were none

    @classmethod
    def of(cls, losses: Iterable[float]) -> LossSum:
        """The exact sum of ``losses``."""
        return cls().add(losses)

    def add(self, losses: Iterable[float]) -> LossSum:
        """A new sum with ``losses`` added."""
        partials, count, nonfinite = list(self.partials), self.count, self.nonfinite
        for loss in losses:
            x = float(loss)
            count += 1
            partials, nonfinite = _accumulate(partials, nonfinite, x)
        return LossSum(tuple(partials), count, nonfinite)

    @classmethod
    def merge(cls, sums: Iterable[LossSum]) -> LossSum:
        """The exact sum of several sums (the data holders' own), in any order."""
        partials: list[float] = []
        count, nonfinite = 0, 0.0
        for s in sums:
            for x in s.partials:
                partials, nonfinite = _accumulate(partials, nonfinite, x)
            count += s.count
            nonfinite += s.nonfinite
        return LossSum(tuple(partials), count, nonfinite)

    @classmethod
    def from_parts(cls, partials: Sequence[object], count: object, nonfinite: object = 0.0) -> LossSum:
        """Rebuild a sum received from a peer; ``ValueError`` if the parts are malformed."""
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(f"loss count must be an integer >= 0, got {count!r}")
        if not isinstance(partials, (list, tuple)) or len(partials) > MAX_PARTIALS:
            raise ValueError(f"loss partials must be a list of at most {MAX_PARTIALS} floats")
        values = []
        for x in partials:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise ValueError(f"loss partials must be finite numbers, got {x!r}")
            values.append(float(x))
        if isinstance(nonfinite, bool) or not isinstance(nonfinite, (int, float)):
            raise ValueError(f"nonfinite must be a number, got {nonfinite!r}")
        return cls.merge([LossSum(), LossSum(tuple(values), count, float(nonfinite))])

    @property
    def total(self) -> float:
        """The correctly rounded exact sum (``inf``/``nan`` if a loss was)."""
        try:
            return math.fsum(self.partials) + self.nonfinite
        except OverflowError:  # partials whose rounded sum exceeds the float range
            return math.copysign(math.inf, self.partials[-1]) + self.nonfinite

    @property
    def mean(self) -> float | None:
        """``total / count``; None when no loss was added."""
        return self.total / self.count if self.count else None
