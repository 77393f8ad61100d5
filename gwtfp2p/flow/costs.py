"""Edge and path costs of the GWTF layered graph, in seconds.

The paper's edge cost approximates the time one microbatch spends crossing from node i to j:
half of each side's compute time, the mean one-way latency, and the transfer of the activation
at the mean bandwidth of both directions. This module owns only the arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


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
