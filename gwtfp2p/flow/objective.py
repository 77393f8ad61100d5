"""The local objective every move is judged by: a potential summed over units.

Each unit contributes f(c) = c^(1 + w) for its path cost c. With w = 0 this is the total cost;
w > 0 penalizes long paths more than short ones, so moves also shorten the most expensive path
(objective 2 of DESIGN.md §2) while staying a true potential: a move changes only the units it
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
