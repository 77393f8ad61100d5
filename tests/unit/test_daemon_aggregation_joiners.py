"""Aggregation with two newcomers and an existing replica they have not heard from yet (found by the
chaos benchmark): the newcomers know each other's membership, the existing replica is online in their
view but its notice is late. A contribution arriving at a newcomer must not let it decide the
iteration without that replica (the fast path over the two of them); everyone waits for the online
peer's membership (bounded by ``UNANNOUNCED_S``) and all three step on the same three contributions.
In-memory: fake part, compute and sender; messages delivered through ``Aggregator.on_contribution``."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import torch

from gwtfp2p.daemon.aggregation import Aggregator
from gwtfp2p.daemon.members import MemberTable
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.model.trainable import StepResult
from gwtfp2p.transport import Ack

OLD, NEW1, NEW2 = "QmAncientPeer111", "QmNewcomerAAAA11", "QmNewcomerBBBB22"
T = 7


class FakePart:
    numel = 3
    grad_dtype = torch.float32

    def __init__(self, me: str) -> None:
        self.me = me

    def grad_contribution(self, replica_id: str) -> GradContribution:
        return GradContribution(replica_id, torch.full((3,), float(len(replica_id))), 1)

    def apply_step(self, contributions: list[GradContribution]) -> StepResult:
        ids = ",".join(sorted(c.replica_id for c in contributions))
        digest = hashlib.sha256(ids.encode()).hexdigest()[:16]
        return StepResult(sum(c.count for c in contributions), 0.0, False, True, 0, digest)


class FakeCompute:
    async def run(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


class Net:
    """Delivers every message at once; ``late`` holds back messages from a sender until released."""

    def __init__(self) -> None:
        self.nodes: dict[str, Aggregator] = {}
        self.late: dict[str, asyncio.Event] = {}

    def sender(self, me: str) -> Any:
        net = self

        class Sender:
            transport = None

            async def send(self, _kind: str, peer: str, meta: Any, tensor: torch.Tensor) -> Ack:
                gate = net.late.get(me)
                if gate is not None:
                    await gate.wait()
                return await net.nodes[peer].on_contribution(me, meta, tensor)

        return Sender()


def build(net: Net, me: str, members: dict[str, int], online: list[str]) -> Aggregator:
    table = MemberTable(me, members[me])
    for peer, first in members.items():
        if peer != me:
            table.add(peer, first)
    aggregator = Aggregator(me, 1, table, FakePart(me), FakeCompute(), net.sender(me), timeout_s=30.0)
    aggregator.online_peers = lambda: [p for p in online if p != me]

    async def alive(_peer: str) -> bool:
        return True

    aggregator.probe = alive
    net.nodes[me] = aggregator
    return aggregator


def test_newcomers_wait_for_an_online_replica_they_have_not_heard_from() -> None:
    async def scenario() -> list[Any]:
        net = Net()
        everyone = [OLD, NEW1, NEW2]
        old = build(net, OLD, {OLD: 0, NEW1: T, NEW2: T}, everyone)  # heard both newcomers' notices
        new1 = build(net, NEW1, {NEW1: T, NEW2: T}, everyone)  # the old replica's notice is late
        new2 = build(net, NEW2, {NEW1: T, NEW2: T}, everyone)
        old.done_through = T - 1
        net.late[OLD] = asyncio.Event()
        rounds = [asyncio.ensure_future(a.aggregate(T)) for a in (new1, new2)]
        await asyncio.sleep(0.6)  # the newcomers exchanged their contributions meanwhile
        assert not any(r.done() for r in rounds), "a newcomer decided without the online replica"
        rounds.append(asyncio.ensure_future(old.aggregate(T)))
        net.late[OLD].set()
        return await asyncio.wait_for(asyncio.gather(*rounds), 20)

    outcomes = asyncio.run(scenario())
    assert {o.members for o in outcomes} == {tuple(sorted((OLD, NEW1, NEW2)))}
    assert len({o.step.state_hash for o in outcomes}) == 1
