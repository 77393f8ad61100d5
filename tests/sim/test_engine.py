"""The event heap: time order, ties in scheduling order, horizon and stop."""

from __future__ import annotations

import pytest

from gwtfp2p.sim.engine import Engine

pytestmark = pytest.mark.timeout(30)


def test_events_run_in_time_order_and_ties_in_schedule_order():
    engine, seen = Engine(), []
    for label, t in (("c", 3.0), ("a", 1.0), ("b1", 2.0), ("b2", 2.0)):
        engine.at(t, seen.append, label)
    engine.run(10.0)
    assert seen == ["a", "b1", "b2", "c"] and engine.now == 3.0


def test_horizon_and_stop():
    engine, seen = Engine(), []
    engine.at(1.0, seen.append, 1)
    engine.at(5.0, seen.append, 5)
    engine.run(2.0)
    assert seen == [1] and engine.now == 2.0
    engine.at(3.0, engine.stop)
    engine.at(4.0, seen.append, 4)
    engine.run(10.0)
    assert seen == [1] and engine.now == 3.0


def test_the_past_is_clamped_to_now():
    engine, seen = Engine(), []
    engine.at(2.0, lambda: engine.at(0.5, seen.append, engine.now))
    engine.run(5.0)
    assert seen == [2.0]
