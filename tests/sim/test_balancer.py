"""SWARM's balancer as released: min-heap of projected time, EMA, probing of newcomers, bans."""

from __future__ import annotations

import random

import pytest

from gwtfp2p.sim.params import SwarmParams
from gwtfp2p.sim.swarm.balancer import Balancer, PerformanceEma

pytestmark = pytest.mark.timeout(30)


def balancer(*uids: str, expiration: float = 300.0) -> Balancer:
    b = Balancer(SwarmParams(), random.Random(0))
    b.update(dict.fromkeys(uids, expiration), now=0.0)
    return b


def test_ema_is_bias_corrected():
    ema = PerformanceEma(0.1)
    ema.update(4.0, 2.0)
    assert ema.seconds_per_sample() == pytest.approx(0.5)  # the first sample is taken as is
    ema.update(4.0, 4.0)
    assert ema.seconds_per_sample() == pytest.approx((0.1 * 1.0 + 0.09 * 0.5) / (1 - 0.81))


def test_unmeasured_replicas_are_charged_the_initial_estimate_in_turn():
    b = balancer("r0", "r1", "r2")
    first = [b.choose(4.0, 1.0) for _ in range(3)]
    assert sorted(first) == ["r0", "r1", "r2"]  # each is probed once before any is reused
    assert b.expected_s("r0", 4.0) == pytest.approx(4.0)  # 1 s per sample until measured


def test_faster_replicas_get_proportionally_more_work():
    b = balancer("fast", "slow")
    for uid, interval in (("fast", 0.4), ("slow", 4.0)):
        for _ in range(20):
            b.observe(uid, 4.0, interval)
    picks = [b.choose(4.0, 1.0) for _ in range(110)]
    assert 9 * picks.count("slow") - 10 <= picks.count("fast") <= 11 * picks.count("slow") + 10


def test_a_newcomer_enters_at_the_heap_minimum():
    b = balancer("r0", "r1")
    for _ in range(10):
        b.choose(4.0, 1.0)
    b.update({"r0": 300.0, "r1": 300.0, "new": 300.0}, now=1.0)
    assert b.choose(4.0, 1.0) == "new"


def test_a_banned_replica_stays_out_until_its_record_expires():
    b = balancer("r0", "r1", expiration=100.0)
    b.ban("r0", now=5.0)
    assert {b.choose(4.0, 6.0) for _ in range(4)} == {"r1"}
    b.update({"r0": 100.0, "r1": 130.0}, now=30.0)  # the same (stale) record: still banned
    assert "r0" not in b.entry
    b.update({"r0": 400.0, "r1": 400.0}, now=60.0)  # a refreshed record (it is alive after all)
    assert "r0" in b.entry


def test_an_expired_record_drops_the_replica():
    b = balancer("r0", "r1")
    b.update({"r1": 1000.0}, now=0.0)
    assert {b.choose(4.0, 500.0) for _ in range(3)} == {"r1"}
    assert "r0" not in b.entry
