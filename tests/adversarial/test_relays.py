"""Modified daemons in a stage: a relay that acknowledges forwards and never computes them (it answered
pings, took all the routing and held training at 0 it/s), and a relay that corrupts what it computes
(caught by the data holder's two-replica output checks, excluded, shown in ``gwtf status``)."""

from __future__ import annotations

import pytest

from tests.adversarial.support import Honest, logged, spawn_hostile_relay, wait_logged

pytestmark = pytest.mark.timeout(360)


def test_a_relay_that_swallows_forwards_is_excluded(honest: Honest) -> None:
    since = honest.iteration()
    swallower = spawn_hostile_relay(honest, "swallower", 1, "swallow", "--capacity", "64")
    try:
        wait_logged(honest.dh, f"peer {swallower.peer_id} excluded", 180)
        assert logged(honest.dh, "delivered no gradient")
        honest.assert_healthy(since, more=3)
    finally:
        swallower.kill_group()


def test_a_corrupting_relay_is_caught_by_cross_checks(honest: Honest) -> None:
    since = honest.iteration()
    liar = spawn_hostile_relay(honest, "liar", 1, "corrupt", "--capacity", "4")
    try:
        caught = honest.dh.wait_for(lambda e: e.get("event") == "cross_check" and e["verdict"] == "liar", 240,
                                    "a cross-check that catches the liar")
        assert caught["liar"] == liar.peer_id and len(caught["peers"]) == 3
        excluded = honest.excluded_in_status(liar.peer_id)
        assert "cross-check" in excluded["reason"] and excluded["by"] == honest.dh.peer_id
        honest.assert_healthy(since, more=3)
    finally:
        liar.kill_group()
