"""Edge and path costs of the GWTF layered graph, in seconds.

The paper's edge cost approximates the time one microbatch spends crossing from node i to j:
half of each side's compute time, the mean one-way latency, and the transfer of the activation
at the mean bandwidth of both directions. This module owns that arithmetic, and the rule by
which measured costs reach a flow node (``SettledCosts``): the daemon and the simulator's gwtf
router feed their flows through it.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable

from gwtfp2p.config import CostSettling


def edge_cost_s(
    compute_i_s: float,
    compute_j_s: float,
    latency_ij_s: float,
    latency_ji_s: float,
    bandwidth_ij_bytes_per_s: float,
    bandwidth_ji_bytes_per_s: float,
    size_bytes: float,
) -> float:
    """d(i,j) = (c_i + c_j)/2 + (λ_ij + λ_ji)/2 + 2·size/(β_ij + β_ji), all in seconds."""
    bandwidth_sum = bandwidth_ij_bytes_per_s + bandwidth_ji_bytes_per_s
    if bandwidth_sum <= 0 or not math.isfinite(bandwidth_sum):
        raise ValueError(f"bandwidths must be positive and finite, got {bandwidth_sum!r}")
    for name, value in (("compute_i_s", compute_i_s), ("compute_j_s", compute_j_s),
                        ("latency_ij_s", latency_ij_s), ("latency_ji_s", latency_ji_s),
                        ("size_bytes", size_bytes)):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
    return (compute_i_s + compute_j_s) / 2 + (latency_ij_s + latency_ji_s) / 2 + 2 * size_bytes / bandwidth_sum


def path_cost_s(edge_costs_s: Iterable[float]) -> float:
    """The cost of a path is the sum of its edges' costs."""
    return float(sum(edge_costs_s))


class SettledCosts:
    """The edge costs a flow holds, moved only by changes that outlast measurement noise.

    Per edge: a moving average of the offered measurements, the cost the flow holds, and a streak of
    offers whose average lay past the tolerance on one side. The first offer sets the held cost; later
    ones move it (to the average) only after ``confirmations`` such offers in a row, so a noisy link
    does not make units trade places between equal replicas (docs/flow.md, "Measured costs").
    """

    def __init__(self, settling: CostSettling | None = None) -> None:
        self.settling = settling or CostSettling()
        self._average: dict[Hashable, float] = {}
        self._held: dict[Hashable, float] = {}
        self._streak: dict[Hashable, tuple[bool, int]] = {}

    def offer(self, key: Hashable, cost_s: float) -> float | None:
        """A new measurement of edge ``key``: the cost the flow should now hold, or None to keep its own."""
        if not math.isfinite(cost_s) or cost_s < 0:
            return None
        s = self.settling
        previous = self._average.get(key)
        average = cost_s if previous is None else (1 - s.smoothing) * previous + s.smoothing * cost_s
        self._average[key] = average
        held = self._held.get(key)
        if held is None:
            self._held[key] = average
            return average
        if abs(average - held) <= max(s.abs_tolerance_s, s.rel_tolerance * held):
            self._streak.pop(key, None)
            return None
        higher = average > held
        side, count = self._streak.get(key, (higher, 0))
        count = count + 1 if side == higher else 1
        if count < s.confirmations:
            self._streak[key] = (higher, count)
            return None
        self._streak.pop(key, None)
        self._held[key] = average
        return average

    def held(self, key: Hashable) -> float | None:
        return self._held.get(key)

    def forget(self, key: Hashable) -> None:
        for table in (self._average, self._held, self._streak):
            table.pop(key, None)
