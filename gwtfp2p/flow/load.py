"""Load model of one node: how many units it can carry and what one more unit costs.

A node carries at most as many units per iteration as fit in its memory and, when an iteration
time budget is set (``FlowParams.iteration_budget_s``), as its GPU and its uplink can serve in
that time. All of a node's sends share its one uplink, so the k-th unit waits for the k−1 before
it: carrying one more unit costs ``load × uplink_s_per_unit`` seconds. Pure arithmetic, used by
FlowNode, the instances and the oracle alike, so the protocol and the oracle solve one model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SLACK = 1e-9  # budget / time per unit is floored; this keeps 3.0 / 1.0 from flooring to 2


@dataclass(frozen=True, kw_only=True)
class NodeResources:
    """Per-unit time a node spends on its GPU and its uplink, per iteration."""

    compute_s_per_unit: float = 0.0
    """Forward plus backward time of one microbatch on this node's part of the model."""
    uplink_s_per_unit: float = 0.0
    """Seconds of this node's uplink that one unit takes per iteration: the bytes it uploads for
    it (activations forward, gradients backward) divided by its upload bandwidth."""

    def __post_init__(self) -> None:
        for name in ("compute_s_per_unit", "uplink_s_per_unit"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    @staticmethod
    def from_uplink(*, compute_s_per_unit: float = 0.0, uplink_bytes_per_s: float,
                    upload_bytes_per_unit: float) -> NodeResources:
        """Resources of a node whose uplink sends ``uplink_bytes_per_s`` and which uploads
        ``upload_bytes_per_unit`` per unit per iteration."""
        if not uplink_bytes_per_s > 0:
            raise ValueError(f"uplink_bytes_per_s must be > 0, got {uplink_bytes_per_s!r}")
        if not (math.isfinite(upload_bytes_per_unit) and upload_bytes_per_unit >= 0):
            raise ValueError(f"upload_bytes_per_unit must be a finite number >= 0, got {upload_bytes_per_unit!r}")
        per_unit = 0.0 if math.isinf(uplink_bytes_per_s) else upload_bytes_per_unit / uplink_bytes_per_s
        return NodeResources(compute_s_per_unit=compute_s_per_unit, uplink_s_per_unit=per_unit)

    def capacity(self, memory_units: int, budget_s: float) -> int:
        """Units per iteration: memory, and with a budget what GPU and uplink serve within it."""
        units = max(0, memory_units)
        if budget_s > 0:
            for per_unit in (self.compute_s_per_unit, self.uplink_s_per_unit):
                if per_unit > 0:
                    units = min(units, math.floor(budget_s / per_unit + SLACK))
        return units


def marginal_cost_s(uplink_s_per_unit: float, load: int) -> float:
    """Extra seconds the next unit waits on an uplink that already carries ``load`` units."""
    return uplink_s_per_unit * max(0, load)


def congestion_cost_s(uplink_s_per_unit: float, load: int) -> float:
    """Total waiting of ``load`` units sharing one uplink: 0 + 1 + … + (load−1) transfers."""
    return uplink_s_per_unit * load * (load - 1) / 2 if load > 1 else 0.0
