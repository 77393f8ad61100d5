"""Exact, order-independent gradient sums: each microbatch's gradient in 64-bit fixed point.

Owns the representation and its arithmetic. A float gradient ``g`` becomes the integers
``round_half_even(g * 2**FRACTION_BITS)`` (int64); integers add exactly, so the sum over any set
of microbatches has the same bits whatever the order, the replica that computed each, or how the
set was split over replicas. ``bound`` (the sum of each added gradient's largest magnitude) proves
that no sum overflowed; past ``BOUND_LIMIT`` the sum is declared unrepresentable and the step is
skipped, like a non-finite gradient. It does not decide clipping or stepping (``trainable.py``).
"""

from __future__ import annotations

import math

import torch

FRACTION_BITS = 40  # resolution 2**-40 ~ 9.1e-13; a sum may reach 2**22 ~ 4.2e6 per element
SCALE = float(2**FRACTION_BITS)
BOUND_LIMIT = 2**62  # a bound at or past this means "not representable" (non-finite or too large)
CHUNK = 1 << 20  # elements converted at a time (bounds the float/int64 temporaries to ~12 MiB)


def to_fixed(values: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``values`` (float32/float64, any shape) in fixed point, and the largest magnitude.

    The magnitude is ``BOUND_LIMIT`` when a value is not finite or too large; the integers are then
    meaningless. Scaling by a power of two is exact and rounding to an integer is exact in the
    values' own dtype, so the result is the same on every device.
    """
    scaled = torch.round(values.detach() * SCALE)
    if scaled.numel() == 0:
        return torch.zeros(values.shape, dtype=torch.int64, device=values.device), 0
    low, high = torch.aminmax(scaled)
    peak = max(-float(low), float(high))
    if not math.isfinite(peak) or peak >= BOUND_LIMIT:
        return torch.zeros(values.shape, dtype=torch.int64, device=values.device), BOUND_LIMIT
    return scaled.to(torch.int64), int(peak)


def to_float(total: torch.Tensor, count: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The mean ``total / count`` of a fixed-point sum as ``dtype``, on the CPU.

    Exactly: ``float64(total)`` (exact below 2**53, else rounded to nearest), one correctly rounded
    float64 division by ``count * 2**FRACTION_BITS``, then rounded to ``dtype``: the same bits on
    any machine. ``count`` must be >= 1.
    """
    if count < 1:
        raise ValueError(f"a mean needs count >= 1, got {count}")
    flat = total.detach().to("cpu").reshape(-1)
    mean = torch.empty(flat.numel(), dtype=dtype)
    for start in range(0, flat.numel(), CHUNK):  # chunks bound the float64 temporary
        mean[start:start + CHUNK] = flat[start:start + CHUNK].to(torch.float64).div_(count * SCALE)
    return mean.view(total.shape)


def add_bounds(*bounds: int) -> int:
    """Bounds add up; anything at or past ``BOUND_LIMIT`` stays ``BOUND_LIMIT``."""
    return min(sum(bounds), BOUND_LIMIT)


class FixedPointSum:
    """A running exact sum of flat gradients (``numel`` elements) and its magnitude bound."""

    def __init__(self, numel: int, device: torch.device | str = "cpu") -> None:
        self.total = torch.zeros(numel, dtype=torch.int64, device=device)
        self.bound = 0

    @property
    def representable(self) -> bool:
        """False once a non-finite or too large gradient was added, or the sums could overflow."""
        return self.bound < BOUND_LIMIT

    def add(self, flat: torch.Tensor, *, start: int = 0) -> None:
        """Add a flat float gradient to elements ``start ..`` (converted chunk by chunk to bound the
        temporaries). The bound grows by its largest magnitude: a microbatch added in several
        pieces gets a looser, still valid, bound."""
        if flat.dim() != 1 or not 0 <= start <= self.total.numel() - flat.numel():
            raise ValueError(f"a flat gradient of {flat.numel()} elements does not fit at {start} in "
                             f"{self.total.numel()}")
        peak = 0
        for first in range(0, flat.numel(), CHUNK):
            fixed, chunk_peak = to_fixed(flat[first:first + CHUNK])
            peak = max(peak, chunk_peak)
            if peak >= BOUND_LIMIT:
                break
            self.total[start + first:start + first + fixed.numel()].add_(fixed.to(self.total.device))
        self.bound = add_bounds(self.bound, peak)

    def add_rows(self, start: int, shape: tuple[int, int], rows: torch.Tensor, values: torch.Tensor) -> None:
        """Add ``values`` [k, width] to rows ``rows`` (distinct) of the ``shape`` = (n, width) matrix
        stored at ``start``: a sparse gradient such as an embedding's, without converting zero rows."""
        n_rows, width = shape
        if values.dim() != 2 or values.shape != (rows.numel(), width) or start < 0 or \
                start + n_rows * width > self.total.numel() or \
                (rows.numel() and not 0 <= int(rows.min()) <= int(rows.max()) < n_rows):
            raise ValueError(f"rows {tuple(values.shape)} do not fit a {shape} matrix at {start}")
        fixed, peak = to_fixed(values)
        if peak < BOUND_LIMIT:
            matrix = self.total[start:start + n_rows * width].view(n_rows, width)
            matrix.index_add_(0, rows.to(matrix.device), fixed.to(matrix.device))
        self.bound = add_bounds(self.bound, peak)

    def clear(self) -> None:
        self.total.zero_()
        self.bound = 0
