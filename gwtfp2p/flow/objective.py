"""The local objective every move is judged by: a potential summed over units.

Each unit contributes f(c) = c^(1 + w) for its path cost c. With w = 0 this is the total cost;
w > 0 penalizes long paths more than short ones, so moves also shorten the most expensive path
(objective 2 of docs/design.md §2) while staying a true potential: a move changes only the units it
touches, so accepting only gains > 0 always terminates. Gains are reported in cost units.
"""

from __future__ import annotations

from collections.abc import Sequence


def potential(path_cost: float, weight: float) -> float:
    return max(path_cost, 0.0) ** (1.0 + weight)


def gain(old_costs: Sequence[float], new_costs: Sequence[float], weight: float) -> float:
    """Decrease of the potential, converted back to cost units at the affected units' mean cost."""
    if weight == 0.0:
        return sum(old_costs) - sum(new_costs)
    power = 1.0 + weight
    raw = sum(max(c, 0.0) ** power for c in old_costs) - sum(max(c, 0.0) ** power for c in new_costs)
    mean = max(1e-12, (sum(old_costs) + sum(new_costs)) / (len(old_costs) + len(new_costs)))
    return raw / (power * mean**weight)


def gain1(old: float, new: float, weight: float) -> float:
    """``gain([old], [new], weight)`` without the generic overhead (hot path of the annealer)."""
    if weight == 0.0:
        return old - new
    power = 1.0 + weight
    mean = max(1e-12, (old + new) / 2)
    return (max(old, 0.0) ** power - max(new, 0.0) ** power) / (power * mean**weight)


def gain2(old_a: float, old_b: float, new_a: float, new_b: float, weight: float) -> float:
    """``gain([old_a, old_b], [new_a, new_b], weight)`` for moves that touch two units."""
    if weight == 0.0:
        return old_a + old_b - new_a - new_b
    power = 1.0 + weight
    mean = max(1e-12, (old_a + old_b + new_a + new_b) / 4)
    raw = (max(old_a, 0.0) ** power + max(old_b, 0.0) ** power
           - max(new_a, 0.0) ** power - max(new_b, 0.0) ** power)
    return raw / (power * mean**weight)
