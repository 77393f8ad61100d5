"""The daemon's one timeout model (``gwtfp2p.daemon.timeouts.Deadlines``): the formulas, their floors and
caps, and that they grow with what they measure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.timeouts import Deadlines, RoundTripModel

TIMINGS = Timings()
DEADLINES = Deadlines(TIMINGS)
TIMEOUT_FACTOR, TRANSFER_FLOOR_S = TIMINGS.timeout_factor, TIMINGS.transfer_floor_s
BACKWARD_FLOOR_S, BACKWARD_CAP_S = TIMINGS.backward_floor_s, TIMINGS.backward_cap_s
transfer_timeout_s, backward_deadline_s = DEADLINES.transfer_s, DEADLINES.backward_s
extended_deadline_s, query_timeout_s = DEADLINES.extended_s, DEADLINES.query_s

seconds = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


def test_transfer_timeout_is_k_times_rtt_plus_wire_time_with_a_floor() -> None:
    assert transfer_timeout_s(None, 0, 1e9) == TRANSFER_FLOOR_S  # nothing measured: the floor
    assert transfer_timeout_s(0.001, 1_000, 1e9) == TRANSFER_FLOOR_S  # loopback: the floor
    # a 0.3 s RTT and 8 MB at 10 MB/s: 4 × (0.3 + 0.8) = 4.4 s
    assert transfer_timeout_s(0.3, 8_000_000, 10e6) == pytest.approx(TIMEOUT_FACTOR * 1.1)
    assert transfer_timeout_s(0.3, 8_000_000, 10e6, emulated_s=0.5) == pytest.approx(TIMEOUT_FACTOR * 1.6)


@given(seconds, st.integers(0, 10**9), st.floats(1e3, 1e10), seconds)
def test_transfer_timeout_at_least_floor_and_monotonic(rtt: float, size: int, bandwidth: float, more: float) -> None:
    base = transfer_timeout_s(rtt, size, bandwidth)
    assert base >= TRANSFER_FLOOR_S
    assert transfer_timeout_s(rtt + more, size, bandwidth) >= base
    assert transfer_timeout_s(rtt, size * 2, bandwidth) >= base


def test_backward_deadline_uses_the_larger_of_measured_and_model() -> None:
    model = RoundTripModel(hops=3, link_s=0.05, compute_s=0.2, queue_depth=4)
    assert model.expected_s() == pytest.approx(3 * (0.1 + 0.8))
    assert backward_deadline_s(None, model) == pytest.approx(TIMEOUT_FACTOR * 2.7)
    assert backward_deadline_s(5.0, model) == pytest.approx(TIMEOUT_FACTOR * 5.0)
    tiny = RoundTripModel(hops=1, link_s=0.0005, compute_s=0.002, queue_depth=1)
    assert backward_deadline_s(0.01, tiny) == BACKWARD_FLOOR_S
    assert backward_deadline_s(1e6, tiny) == BACKWARD_CAP_S


@given(seconds, st.integers(1, 64), seconds, seconds, st.integers(0, 1000))
def test_backward_deadline_bounds(measured: float, hops: int, link: float, compute: float, queue: int) -> None:
    deadline = backward_deadline_s(measured, RoundTripModel(hops, link, compute, queue))
    assert BACKWARD_FLOOR_S <= deadline <= BACKWARD_CAP_S
    assert deadline >= min(BACKWARD_CAP_S, TIMEOUT_FACTOR * measured)


def test_a_live_but_late_hop_doubles_the_deadline_up_to_the_cap() -> None:
    assert extended_deadline_s(2.0) == 4.0
    assert extended_deadline_s(BACKWARD_CAP_S * 0.75) == BACKWARD_CAP_S


def test_query_timeout_from_the_slowest_known_rtt() -> None:
    assert query_timeout_s([]) == 1.0
    assert query_timeout_s([None, 0.01]) == 1.0
    assert query_timeout_s([0.1, 0.5, None]) == pytest.approx(TIMEOUT_FACTOR * 0.5)


def test_a_ping_is_a_transfer_of_nothing_and_the_timings_set_every_figure() -> None:
    assert DEADLINES.ping_s(None) == TRANSFER_FLOOR_S and DEADLINES.ping_s(2.0) == pytest.approx(8.0)
    strict = Deadlines(Timings(timeout_factor=2.0, transfer_floor_s=0.5, backward_cap_s=10.0, query_floor_s=0.1))
    assert strict.ping_s(1.0) == 2.0 and strict.ping_s(0.01) == 0.5
    assert strict.backward_s(100.0, RoundTripModel(1, 0.0, 0.0, 1)) == 10.0
    assert strict.query_s([]) == 0.1
