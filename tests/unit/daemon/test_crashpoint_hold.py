"""Test tooling that makes a crash point mean the same whatever the timing: a relay armed to crash when a
gradient arrives (``exit_before_backward``) first waits until every forward of that iteration it received
went on (``RelayPath._forwards_sent``). Without the wait, a gradient that overtook a forward still queued
on the compute thread crashed the relay with that forward unsent: the data holder found nobody downstream
holding it and resent it as a forward, and ``test_relay_crash_mid_backward`` (which asserts every resend
rejoins the stage-2 holder) failed twice in one CI run.
"""

from __future__ import annotations

import asyncio

from gwtfp2p.daemon.datapath.kept import Kept
from gwtfp2p.daemon.datapath.receiver import HopRecord, HopTable
from gwtfp2p.daemon.datapath.relay import RelayPath
from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.transport import TransferMeta
from tests.unit.daemon.fakes import PA, PB, mb

ITERATION = 3


class Outbox:
    def __init__(self) -> None:
        self.kept: dict[str, Kept] = {}

    def get(self, key: str) -> Kept | None:
        return self.kept.get(key)

    def send(self, index: int, *, taken: bool) -> Kept:
        kept = Kept(TransferMeta(microbatch=mb(index, iteration=ITERATION), stage=2), None,
                    Hop(PB, "") if taken else None, 0.0, 1.0, 1.0, 1.0, busy=not taken)
        self.kept[mb(index, iteration=ITERATION).key] = kept
        return kept


def relay(outbox: Outbox, received: list[tuple[int, int]]) -> RelayPath:
    path = RelayPath.__new__(RelayPath)  # only what the wait reads: the hop records and the outbox
    path.hops, path.outbox = HopTable(), outbox
    for index, iteration in received:
        key = mb(index, iteration=iteration).key
        path.hops.records[key] = HopRecord(TransferMeta(microbatch=mb(index, iteration=iteration), stage=1), PA)
    return path


async def still_waiting(task: asyncio.Task) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(task), 0.1)
    except asyncio.TimeoutError:
        return True
    return False


def test_the_crash_before_a_backward_waits_for_the_iterations_forwards_to_go_on() -> None:
    async def run() -> None:
        outbox = Outbox()
        path = relay(outbox, [(0, ITERATION), (1, ITERATION), (2, ITERATION + 1)])
        outbox.send(0, taken=True)  # its gradient is the one arriving
        task = asyncio.ensure_future(path._forwards_sent(ITERATION, timeout_s=30.0))
        assert await still_waiting(task), "microbatch 1 is still queued for its forward"
        sending = outbox.send(1, taken=False)
        assert await still_waiting(task), "microbatch 1 is on its way, not yet taken"
        sending.hop, sending.busy = Hop(PB, ""), False
        await asyncio.wait_for(task, 5.0)  # the next iteration's queued forward is not waited for

    asyncio.run(run())


def test_the_wait_has_a_deadline() -> None:
    async def run() -> None:
        path = relay(Outbox(), [(0, ITERATION)])
        await asyncio.wait_for(path._forwards_sent(ITERATION, timeout_s=0.2), 5.0)

    asyncio.run(run())
