"""The swarm's pace as a data holder reports it (``datapath/pace.py``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtfp2p.daemon.datapath.pace import Pace


def test_the_first_iteration_counts_from_its_start_and_the_next_from_the_previous_close():
    pace = Pace()
    assert pace.close(now_s=12.0, began_at_s=10.0, tokens=8192) == (2.0, 4096.0)
    # t+1 began at 12.9 (the aggregation and step took 0.9 s) and closed at 14.5: its pace counts both
    assert pace.close(now_s=14.5, began_at_s=12.9, tokens=8192) == pytest.approx((2.5, 8192 / 2.5))


def test_no_time_gives_no_rate_rather_than_a_division_by_zero():
    pace = Pace()
    assert pace.close(now_s=5.0, began_at_s=5.0, tokens=100) == (0.0, 0.0)


@given(st.lists(st.tuples(st.floats(0.0, 100.0), st.floats(0.001, 100.0)), min_size=1, max_size=20),
       st.integers(0, 10**6))
def test_the_pace_never_exceeds_the_iterations_own_rate_and_periods_add_up(gaps_and_spans, tokens):
    """Whatever the waits between iterations: each period is at least the iteration's own span, and the
    periods add up to the time from the first start to the last close."""
    pace, now_s, first_start = Pace(), 0.0, None
    total_s = 0.0
    for gap_s, span_s in gaps_and_spans:
        began_s = now_s + gap_s
        first_start = began_s if first_start is None else first_start
        now_s = began_s + span_s
        period_s, tokens_per_s = pace.close(now_s, began_s, tokens)
        assert period_s >= span_s - 1e-9
        assert tokens_per_s <= tokens / span_s + 1e-6
        total_s += period_s
    assert total_s == pytest.approx(now_s - first_start)
