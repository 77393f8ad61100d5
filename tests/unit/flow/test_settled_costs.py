"""``SettledCosts``: measured edge costs reach the flow only when a change outlasts the noise."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtfp2p.config import ConfigError, CostSettling
from gwtfp2p.flow.costs import SettledCosts

SETTLING = CostSettling()


def test_the_first_measurement_is_held_and_noise_within_the_tolerance_never_moves_it() -> None:
    costs = SettledCosts()
    assert costs.offer("p", 0.010) == 0.010 and costs.held("p") == 0.010
    rng = random.Random(1)
    moved = [costs.offer("p", 0.010 * (1 + rng.uniform(-0.8, 0.8))) for _ in range(2000)]
    assert moved == [None] * 2000 and costs.held("p") == 0.010


def test_a_lasting_change_is_taken_after_the_confirmations_at_the_smoothed_value() -> None:
    costs = SettledCosts(CostSettling(smoothing=0.5, rel_tolerance=0.4, confirmations=3))
    costs.offer("p", 0.100)
    answers = [costs.offer("p", 0.400) for _ in range(5)]
    # averages 0.25, 0.325, 0.3625: past 0.14 from the third offer on, so the third moves the flow
    assert answers[:2] == [None, None] and answers[2] == pytest.approx(0.3625)
    assert costs.held("p") == pytest.approx(0.3625) and answers[3] is None  # 0.381 is within 40 % of it


def test_a_streak_restarts_when_the_change_flips_side_or_falls_back_inside() -> None:
    costs = SettledCosts(CostSettling(smoothing=1.0, rel_tolerance=0.2, confirmations=2))
    costs.offer("p", 1.0)
    assert costs.offer("p", 2.0) is None  # first above
    assert costs.offer("p", 0.5) is None  # below: a new streak
    assert costs.offer("p", 1.1) is None  # inside: no streak
    assert costs.offer("p", 0.5) is None
    assert costs.offer("p", 0.5) == 0.5


def test_tiny_changes_below_the_absolute_floor_never_count() -> None:
    costs = SettledCosts(CostSettling(smoothing=1.0, confirmations=1))
    costs.offer("p", 0.001)
    assert costs.offer("p", 0.0025) is None  # 150 % more, but 1.5 ms
    assert costs.offer("p", 0.004) == 0.004


def test_forget_and_garbage() -> None:
    costs = SettledCosts()
    costs.offer("p", 0.01)
    assert costs.offer("p", math.nan) is None and costs.offer("p", -1.0) is None and costs.offer("q", math.inf) is None
    costs.forget("p")
    assert costs.held("p") is None and costs.offer("p", 0.5) == 0.5  # a returning neighbour starts afresh


@pytest.mark.parametrize("field, value", [("smoothing", 0.0), ("smoothing", 1.5), ("rel_tolerance", -0.1),
                                          ("abs_tolerance_s", -1.0), ("confirmations", 0)])
def test_settings_are_validated_naming_the_field(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"CostSettling.{field}"):
        CostSettling(**{field: value})


@given(st.lists(st.floats(min_value=1e-4, max_value=10.0), min_size=1, max_size=200),
       st.integers(min_value=1, max_value=5))
def test_the_held_cost_moves_at_most_once_per_confirmations_offers(samples: list[float], confirmations: int) -> None:
    costs = SettledCosts(CostSettling(confirmations=confirmations))
    moves = [i for i, s in enumerate(samples) if costs.offer("p", s) is not None]
    assert moves[0] == 0
    assert all(b - a >= confirmations for a, b in itertools.pairwise(moves))


@given(st.floats(min_value=0.005, max_value=1.0), st.floats(min_value=2.0, max_value=50.0))
def test_a_step_of_twice_the_cost_or_more_reaches_the_flow_within_seven_probes(base: float, factor: float) -> None:
    """With the defaults: the average passes +40 % after 5 probes of a doubled cost, and 3 in a row confirm."""
    costs = SettledCosts()
    costs.offer("p", base)
    taken = next((i for i in range(1, 40) if costs.offer("p", base * factor) is not None), None)
    assert taken is not None and taken <= 7, taken
