"""Aggregation with two newcomers and an existing replica they have not heard from yet (found by the
chaos benchmark): the newcomers know each other's membership, the existing replica is online in their
view but its notice is late. A contribution arriving at a newcomer must not let it decide the
iteration without that replica (the fast path over the two of them); everyone waits for the online
peer's membership (bounded by ``Timings.unannounced_s``) and all three step on the same three contributions.
In-memory: fake part, compute and sender; messages delivered through ``Aggregator.on_contribution``."""

from __future__ import annotations

import asyncio
import hashlib
import time
from types import SimpleNamespace
from typing import Any

import torch

from gwtfp2p.daemon.aggregation.aggregator import Aggregator
from gwtfp2p.daemon.aggregation.members import MemberTable
from gwtfp2p.daemon.aggregation.state import PartState
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.wire import QUERY, STARTING_UP
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.model.trainable import StepResult
from gwtfp2p.transport import Ack

OLD, NEW1, NEW2 = "QmAncientPeer111", "QmNewcomerAAAA11", "QmNewcomerBBBB22"
T = 7


class FakePart:
    """The part as ``PartState`` uses it; a step's hash names the replicas whose contributions it reduced."""

    numel = 3
    grad_dtype = torch.float32
    spec = SimpleNamespace(clip_mode="per_part", aggregate_codec="none", screen_factor=64.0)

    def __init__(self, me: str) -> None:
        self.me = me
        self.reduced: list[str] = []

    def grad_contribution(self, replica_id: str) -> GradContribution:
        return GradContribution(replica_id, torch.full((3,), len(replica_id), dtype=torch.int64), 1)

    def reduce(self, contributions: list[GradContribution]) -> tuple[torch.Tensor, int]:
        self.reduced = sorted(c.replica_id for c in contributions)
        return torch.zeros(3), sum(c.count for c in contributions)

    def grad_sq_norm(self, mean: torch.Tensor) -> float:
        return 0.0

    def apply_mean(self, mean: torch.Tensor, count: int, *, total_sq_norm: float | None = None) -> StepResult:
        digest = hashlib.sha256(",".join(self.reduced).encode()).hexdigest()[:16]
        return StepResult(count, 0.0, False, True, 0, digest)


class FakeCompute:
    async def run(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


class Net:
    """Delivers every message at once; ``late`` holds back messages from a sender until released."""

    def __init__(self) -> None:
        self.nodes: dict[str, Aggregator] = {}
        self.late: dict[str, asyncio.Event] = {}
        self.unconfirmed: set[tuple[str, str]] = set()  # (sender, receiver): queries the receiver cannot confirm

    def sender(self, me: str) -> Any:
        net = self

        class Sender:
            transport = None

            async def send(self, _kind: str, peer: str, meta: Any, tensor: torch.Tensor) -> Ack:
                gate = net.late.get(me)
                if gate is not None:
                    await gate.wait()
                if peer not in net.nodes:  # still starting up
                    return Ack(accepted=False, reason=STARTING_UP)
                confirmed = meta.tags.get("op") != QUERY or (me, peer) not in net.unconfirmed
                return await net.nodes[peer].on_contribution(me, meta, tensor, confirmed)

        return Sender()


class AlwaysAlive:
    async def alive(self, _peer: str) -> bool:
        return True


def build(net: Net, me: str, members: dict[str, int], online: list[str], prober: Any = None) -> Aggregator:
    table = MemberTable(me, members[me])
    for peer, first in members.items():
        if peer != me:
            table.add(peer, first)
    state = PartState(FakePart(me), members[me], replay_steps=0, replay_budget_bytes=0)
    others = [p for p in online if p != me]
    aggregator = Aggregator(me, 1, table, state, compute=FakeCompute(), sender=net.sender(me),
                            prober=prober or AlwaysAlive(), online_peers=lambda: others,
                            events=Events(), timings=Timings(aggregation_timeout_s=30.0), clock=time.monotonic)
    net.nodes[me] = aggregator
    return aggregator


async def step(aggregator: Aggregator) -> Any:
    return await aggregator.step(await aggregator.gather(T), None)


def test_newcomers_wait_for_an_online_replica_they_have_not_heard_from() -> None:
    async def scenario() -> list[Any]:
        net = Net()
        everyone = [OLD, NEW1, NEW2]
        old = build(net, OLD, {OLD: 0, NEW1: T, NEW2: T}, everyone)  # heard both newcomers' notices
        new1 = build(net, NEW1, {NEW1: T, NEW2: T}, everyone)  # the old replica's notice is late
        new2 = build(net, NEW2, {NEW1: T, NEW2: T}, everyone)
        old.done_through = T - 1
        net.late[OLD] = asyncio.Event()
        rounds = [asyncio.ensure_future(step(a)) for a in (new1, new2)]
        await asyncio.sleep(0.6)  # the newcomers exchanged their contributions meanwhile
        assert not any(r.done() for r in rounds), "a newcomer decided without the online replica"
        rounds.append(asyncio.ensure_future(step(old)))
        net.late[OLD].set()
        return await asyncio.wait_for(asyncio.gather(*rounds), 20)

    outcomes = asyncio.run(scenario())
    assert {o.members for o in outcomes} == {tuple(sorted((OLD, NEW1, NEW2)))}
    assert len({o.step.state_hash for o in outcomes}) == 1


class Probes:
    """A prober to whom ``dead`` never answer."""

    def __init__(self, dead: set[str]) -> None:
        self.dead = dead

    async def alive(self, peer: str) -> bool:
        return peer not in self.dead


def test_a_leader_whose_death_claim_we_cannot_confirm_still_gets_our_report() -> None:
    """The leader found the joiner dead (its probe failed), the other replica's probe reaches it (it is still
    starting up, so it sends no contribution): the guard does not confirm the leader's claim, yet the query
    is answered for this round, so both replicas step on the same two contributions at once; unanswered, the
    leader found the replica silent and each stepped alone after the deadline (a CI failure of stop 26)."""
    leader, replica, joiner = "QmAAAALeader1111", "QmBBBBSecond2222", "QmJJJJJoiner3333"

    async def scenario() -> list[Any]:
        net = Net()
        net.unconfirmed = {(leader, replica)}  # the replica's guard cannot confirm what the leader claims
        members = {leader: 0, replica: 0, joiner: T}
        a = build(net, leader, members, [leader, replica, joiner], prober=Probes({joiner}))
        b = build(net, replica, members, [leader, replica, joiner])
        for aggregator in (a, b):
            aggregator.done_through = T - 1
        return await asyncio.wait_for(asyncio.gather(step(a), step(b)), 20)

    outcomes = asyncio.run(scenario())
    assert [o.members for o in outcomes] == [("QmAAAALeader1111", "QmBBBBSecond2222")] * 2
    assert len({o.step.state_hash for o in outcomes}) == 1
