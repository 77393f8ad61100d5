"""Joiners against the rounds of the replicas: a notice naming an iteration a replica already decided is
refused as stale (its push list and decision went out without the sender, which would then wait for that
round forever); one naming the next iteration is taken; a contribution pushed to a joiner still starting up
is retried until it serves. In-memory: the aggregation fakes of ``test_aggregation_joiners``; no network."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from gwtfp2p.daemon.aggregation.aggregator import REFUSED_RETRIES, Aggregator
from gwtfp2p.daemon.aggregation.membership import Membership
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.wire import STARTING_UP, Member, decode_payload
from gwtfp2p.transport import Ack
from tests.unit.daemon.test_aggregation_joiners import NEW1, NEW2, OLD, Net, T, build

JOINER = "QmJoinerCCCCC333"


class NoTransport:
    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None:
        raise AssertionError("accepts() sends nothing")


def notices(aggregator: Aggregator) -> Membership:
    return Membership(1, aggregator.members, transport=NoTransport(), same_part_peers=list,
                      fixed_through=aggregator.fixed_through, iteration=lambda: T, timeout_s=1.0)


def test_a_notice_for_a_decided_round_is_stale_and_the_next_one_is_taken() -> None:
    async def scenario() -> None:
        net = Net()
        pair = [build(net, me, {OLD: 0, NEW1: 0}, [OLD, NEW1]) for me in (OLD, NEW1)]
        for replica in pair:
            replica.done_through = T - 1
        membership = notices(pair[0])
        assert pair[0].fixed_through() == T - 1
        assert membership.accepts(NEW2, Member(stage=1, from_iteration=T)), "round T not begun: the notice joins it"
        pair[0].members.remove(NEW2)
        await asyncio.wait_for(asyncio.gather(*(r.gather(T) for r in pair)), 10)  # decided, not stepped
        assert pair[0].done_through == T - 1 and pair[0].fixed_through() == T
        assert not membership.accepts(JOINER, Member(stage=1, from_iteration=T))
        assert JOINER not in pair[0].members
        assert membership.accepts(JOINER, Member(stage=1, from_iteration=T + 1))
        assert pair[0].members.expected(T + 1) == sorted((OLD, NEW1, JOINER))

    asyncio.run(scenario())


class StartingUp:
    """``inner`` but ``peer`` answers *starting up* to the first ``refusals`` sends (a joiner still joining)."""

    def __init__(self, inner: Any, peer: str, refusals: int) -> None:
        self.inner, self.peer, self.left = inner, peer, refusals

    async def send(self, kind: str, peer: str, meta: Any, tensor: torch.Tensor) -> Ack:
        if peer == self.peer and self.left > 0:
            self.left -= 1
            return Ack(accepted=False, reason=STARTING_UP)
        return await self.inner.send(kind, peer, meta, tensor)


def test_a_contribution_waits_for_a_joiner_that_is_still_starting_up() -> None:
    """Found in the hostile-peer suite: a joiner that reserved an iteration was still in its handshake (a
    silent peer took 20 s) when the replicas pushed their contributions; after 20 refusals they gave up, and
    the joiner waited for them forever. Refusals for *starting up* are retried while the aggregation deadline
    lasts."""
    async def scenario() -> list[Any]:
        net = Net()
        pair = [build(net, me, {OLD: 0, NEW1: 0}, [OLD, NEW1]) for me in (OLD, NEW1)]
        for replica in pair:
            replica.done_through = T - 1
            replica.timings = Timings(aggregation_timeout_s=30.0, refused_retry_s=0.001)
        pair[0].sender = StartingUp(pair[0].sender, NEW1, refusals=3 * REFUSED_RETRIES)
        return await asyncio.wait_for(asyncio.gather(*(r.gather(T) for r in pair)), 20)

    gathered = asyncio.run(scenario())
    assert [g.members for g in gathered] == [tuple(sorted((OLD, NEW1)))] * 2


class Answers:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None:
        self.sent.append(decode_payload(payload))


def test_a_senders_notices_are_taken_in_the_order_they_came() -> None:
    """A joiner's notice of T (refused elsewhere) waits for the guard to read its record; its reservation of
    T + 2 comes meanwhile. Taken as they finish vetting, T would replace T + 2 and this replica would wait
    for the joiner at T, where it never pushes. Taken in order, the reservation stands."""

    async def scenario() -> tuple[list[int], Any, list[Any]]:
        net = Net()
        replica = build(net, OLD, {OLD: 0}, [OLD])
        replica.done_through = T - 1
        transport = Answers()
        membership = Membership(1, replica.members, transport=transport, same_part_peers=list,
                                fixed_through=replica.fixed_through, iteration=lambda: T, timeout_s=1.0)
        record_read = asyncio.Event()
        vetted: list[int] = []

        async def vet(sender: str, member: Member) -> bool:
            if member.from_iteration == T:
                await record_read.wait()  # the first notice waits for the view
            vetted.append(member.from_iteration)
            return True

        first = asyncio.ensure_future(membership.on_notice(JOINER, Member(stage=1, from_iteration=T), vet))
        second = asyncio.ensure_future(membership.on_notice(JOINER, Member(stage=1, from_iteration=T + 2), vet))
        await asyncio.sleep(0)
        record_read.set()
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        return vetted, replica.members.get(JOINER), transport.sent

    vetted, membership, answers = asyncio.run(scenario())
    assert vetted == [T, T + 2]
    assert membership is not None and membership.from_iteration == T + 2
    assert [(a.from_iteration, a.accepted) for a in answers] == [(T, True), (T + 2, True)]
