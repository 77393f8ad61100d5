"""Progress, not pings: a next hop that answers probes but delivers no gradient is excluded (while another
replica of its stage lives) and its outputs are resent; an excluded peer stays dead whatever its heartbeats
say until its exclusion ends. Fakes and an injected clock; no sleeps."""

from __future__ import annotations

import asyncio

import pytest
import torch

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.datapath.delivery import DeliveryWatch
from gwtfp2p.daemon.swarm.exclusions import Exclusions
from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.daemon.swarm.liveness import Liveness
from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.daemon.timeouts import Deadlines
from gwtfp2p.transport import TransferMeta
from tests.unit.daemon.fakes import DA, DB, DH, PA, PB, FakeClock, FakeNetwork, FakePinger, FakeSender, U, mb
from tests.unit.daemon.test_recovery import relay_recovery

pytestmark = pytest.mark.timeout(30)


def test_a_hop_that_delivers_nothing_counts_after_the_limit() -> None:
    watch = DeliveryWatch(limit=3)
    assert not watch.answered_late(PA, 10.0) and not watch.answered_late(PA, 10.0)
    assert watch.answered_late(PA, 10.0)
    watch.delivered(PB, 5.0)
    assert not watch.answered_late(PB, 4.0)  # PB delivered after that output was sent: slow, not swallowing
    watch.delivered(PA, 20.0)  # one gradient back resets the count
    assert not watch.answered_late(PA, 12.0) and not watch.answered_late(PA, 30.0)


def test_exclusions_end() -> None:
    clock = FakeClock(0.0)
    exclusions = Exclusions(60.0, clock)
    exclusions.add(PA, "no progress")
    assert exclusions.active(PA) and [e.peer for e in exclusions.current()] == [PA]
    clock.advance(60.0)
    assert not exclusions.active(PA) and exclusions.current() == []


def test_an_excluded_peer_is_not_revived_by_its_heartbeats() -> None:
    clock = FakeClock(0.0)
    told: list[str] = []
    liveness = Liveness(U, FakePinger(), LinkTable(1e9), Deadlines(Timings()), Timings(),
                        exclusions=Exclusions(60.0, clock))
    liveness.subscribe(told.append)
    assert liveness.seen(PA, 1.0)
    liveness.exclude(PA, "took 4 microbatches, delivered none")
    assert told == [PA] and liveness.is_dead(PA)
    assert not liveness.seen(PA, 99.0) and liveness.is_dead(PA)  # a newer heartbeat revives the dead, not it
    assert not asyncio.run(liveness.alive(PA))
    clock.advance(61.0)
    assert liveness.seen(PA, 100.0) and not liveness.is_dead(PA)


def _late(recovery, clock: FakeClock, network: FakeNetwork) -> None:
    """One deadline pass with the next hop answering its probe."""
    clock.advance(recovery.outbox.table.entries[mb(0).key].wait_s + 0.01)
    recovery.check()


@pytest.mark.parametrize("case", ["swallower", "only_replica", "stage_stuck"])
def test_a_swallowing_hop_is_excluded_and_its_outputs_resent(case: str) -> None:
    """PA answers every probe and never sends a gradient back; PB (another replica of its stage) delivers,
    except when the whole stage is stuck; with PB absent PA is the stage's only replica."""
    async def scenario() -> tuple[FakeNetwork, FakeSender]:
        stages = {DH: 0, U: 1, PA: 2, DA: 3, DB: 3, **({} if case == "only_replica" else {PB: 2})}
        network, sender, clock = FakeNetwork(stages), FakeSender(), FakeClock()
        recovery = relay_recovery(network, sender, [], clock)
        for index in (0, 1):
            await recovery.outbox.send(TransferMeta(microbatch=mb(index), stage=2, path=(DH, U)), torch.zeros(1),
                                       Hop(PA, f"u{index}"))
        if case == "swallower":  # PB takes one later and its gradient comes back
            await recovery.outbox.send(TransferMeta(microbatch=mb(2), stage=2, path=(DH, U)), torch.zeros(1),
                                       Hop(PB, "u2"))
            clock.advance(0.5)
            recovery.outbox.backward_arrived(mb(2).key, TransferMeta(microbatch=mb(2), stage=1))
        for _ in range(4):
            _late(recovery, clock, network)
            for _ in range(20):
                await asyncio.sleep(0)
        await recovery.background.close()
        return network, sender

    network, sender = asyncio.run(scenario())
    if case == "swallower":
        assert [p for p, _ in network.excluded] == [PA] and "delivered no gradient" in network.excluded[0][1]
        resent = [(hop.peer, meta.microbatch.index) for hop, meta in sender.sent if hop and hop.peer == PB]
        assert sorted(i for _, i in resent if i < 2) == [0, 1]
    else:  # the stage's only replica, or all its replicas silent: excluding would stall instead of reroute
        assert network.excluded == []
