"""Neighbouring replicas dead in one iteration (``datapath/redo_chain.py``): L1 (stage 1) and L2 (stage 2) die
before their stages aggregate. Microbatch 0 went DH → L1 → L2 → DH, so no live neighbour holds stage 1's
gradient or stage 2's input of it: the survivors S1 and S2 rebuild them (S1 recomputes the output and pushes
it up, S2 redoes and pushes the input gradient down). Microbatches 1 (L1 → S2) and 2 (S1 → L2) are redone
from what the live neighbours kept, as with one death. In memory, through the real wire codec."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import torch

from gwtfp2p.daemon.aggregation.encoding import WireContribution
from gwtfp2p.daemon.aggregation.rounds import Gathered, Received
from gwtfp2p.daemon.aggregation.state import PartState
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.datapath.kept import Kept
from gwtfp2p.daemon.datapath.receiver import HopRecord, HopTable
from gwtfp2p.daemon.datapath.redo import LostWork
from gwtfp2p.daemon.datapath.redo_chain import Chain, Halves
from gwtfp2p.daemon.events import Events
from gwtfp2p.transport import MicrobatchId, TransferMeta
from tests.unit.daemon.test_aggregation_joiners import FakeCompute, FakePart
from tests.unit.daemon.test_redo import FakeExecutor, Net, Outputs

DH, S1, L1, S2, L2 = "QmDataHo1der1111", "QmSurvivor1Stage", "QmGone1Stage1111", "QmSurvivor2Stage", "QmGone2Stage2222"
STAGES = {DH: ("data", 0), S1: ("relay", 1), L1: ("relay", 1), S2: ("relay", 2), L2: ("relay", 2)}
T = 7


def mb(index: int) -> MicrobatchId:
    return MicrobatchId(data_holder=DH, iteration=T, index=index)


def kept(index: int, stage: int, value: float) -> Kept:
    return Kept(TransferMeta(microbatch=mb(index), stage=stage), torch.full((1, 1, 3), value), None, 0.0, 1.0, 1.0, 1.0)


def hops(stage: int, sent: dict[int, tuple[str, float]]) -> HopTable:
    """Gradients sent back (microbatch -> (to whom, value))."""
    table = HopTable()
    for i, (prev, value) in sent.items():
        table.records[mb(i).key] = HopRecord(TransferMeta(microbatch=mb(i), stage=stage), prev,
                                             grad=torch.full((1, 1, 3), value))
    return table


def node(net: Net, me: str, *, executor: FakeExecutor | None, outputs: Outputs, table: HopTable,
         dead: set[str], timeout_s: float = 2.0) -> LostWork:
    stage = STAGES[me][1]
    recs = {p: SimpleNamespace(peer_id=p, role=role, stage=s, state="online") for p, (role, s) in STAGES.items()}
    view = SimpleNamespace(records=recs, seen=recs,
                           by_stage=lambda s: [r for _, r in sorted(recs.items()) if r.stage == s])
    work = LostWork(me, stage, 2, inputs_to={0: 1, 1: 2, 2: 0}[stage], grads_to={0: 2, 1: 0, 2: 1}[stage],
                    outbox=outputs, hops=table, executor=executor,
                    state=PartState(FakePart(me), T, replay_steps=0, replay_budget_bytes=0), sender=net.sender(me),
                    transport=net.sender(me), view=view, is_dead=lambda p: p in dead, compute=FakeCompute(),
                    swarm_microbatches=lambda t: 4 if t == T else None, events=Events(),
                    timings=Timings(redo_timeout_s=timeout_s), clock=time.monotonic)
    net.nodes[me] = work
    return work


def gathered(me: str, lost: str) -> Gathered:
    own = Received(WireContribution(me, torch.tensor([1, 1, 1]), 2, 10), {})
    return Gathered(T, (me,), {me: {}}, torch.zeros(3), 2, 0.0, "leader", (lost,), 0.0, (own,), (lost,))


def swarm(net: Net, dead: set[str]) -> tuple[LostWork, LostWork, FakeExecutor, FakeExecutor]:
    """Stage 1: L1 did microbatches 0 and 1, S1 2 and 3; stage 2: L2 did 0 and 2, S2 1 and 3."""
    node(net, DH, executor=None, dead=dead,
         outputs=Outputs({L1: [kept(0, 1, 1.0), kept(1, 1, 1.1)], S1: [kept(2, 1, 1.2), kept(3, 1, 1.3)]}),
         table=hops(0, {0: (L2, 0.5), 1: (S2, 0.51), 2: (L2, 0.52), 3: (S2, 0.53)}))
    e1, e2 = FakeExecutor(), FakeExecutor()
    s1 = node(net, S1, executor=e1, dead=dead, outputs=Outputs({L2: [kept(2, 2, 2.4)], S2: [kept(3, 2, 2.6)]}),
              table=hops(1, {2: (DH, 0.0), 3: (DH, 0.0)}))
    s2 = node(net, S2, executor=e2, dead=dead, outputs=Outputs({DH: [kept(1, 0, 2.2), kept(3, 0, 2.6)]}),
              table=hops(2, {1: (L1, 0.3), 3: (S1, 0.31)}))
    return s1, s2, e1, e2


async def both(s1: LostWork, s2: LostWork) -> tuple[Gathered, Gathered]:
    return await asyncio.gather(s1.complete(gathered(S1, L1)), s2.complete(gathered(S2, L2)))


def test_the_survivors_rebuild_the_halves_a_dead_pair_took_along() -> None:
    net = Net()
    s1, s2, e1, e2 = swarm(net, {L1, L2})
    started = time.monotonic()
    r1, r2 = asyncio.run(both(s1, s2))
    assert time.monotonic() - started < 1.0  # every half came: no deadline waited out
    assert e1.calls == [[mb(0).key, mb(1).key]] and e2.calls == [[mb(0).key, mb(2).key]]
    x2, g2 = e2.items[mb(0).key]
    assert torch.equal(x2, 2 * torch.full((1, 1, 3), 1.0)) and torch.equal(g2, torch.full((1, 1, 3), 0.5))
    x1, g1 = e1.items[mb(0).key]  # the input the DH kept; the gradient S2's redo sent back down
    assert torch.equal(x1, torch.full((1, 1, 3), 1.0)) and torch.equal(g1, 3 * g2)
    assert torch.equal(e1.items[mb(1).key][1], torch.full((1, 1, 3), 0.3))  # from S2's own kept gradients
    assert torch.equal(e2.items[mb(2).key][0], torch.full((1, 1, 3), 2.4))  # from S1's own kept outputs
    assert (r1.count, r1.dropped, r2.count, r2.dropped) == (4, (), 4, ())


def with_theirs(me: str, dead: str) -> Gathered:
    """``me``'s step with the dead replica's sum in it (it reached ``me`` before it died): nothing lost."""
    own = Received(WireContribution(me, torch.tensor([1, 1, 1]), 2, 10), {})
    theirs = Received(WireContribution(dead, torch.tensor([2, 2, 2]), 2, 10), {})
    return Gathered(T, tuple(sorted((me, dead))), {me: {}, dead: {}}, torch.zeros(3), 4, 0.0, "fast", (), 0.0,
                    (own, theirs), ())


def test_a_stage_whose_step_lost_nothing_serves_the_input_rebuilt_for_it() -> None:
    """L2's sum reached S2 before L2 died, L1's died with it: S2's step lost nothing, S1 redoes microbatches 0
    and 1. Microbatch 0's gradient went to L2, so S1 rebuilds its output and pushes it up; S2 asks the data
    holder for that microbatch's gradient by key (it went to L2, a member), redoes it for the input gradient
    alone and pushes that down. S2's own step is untouched (the churn demo's seed 1 at 19e29e5 lost this)."""
    net = Net()
    s1, s2, e1, e2 = swarm(net, {L1, L2})
    whole = with_theirs(S2, L2)
    started = time.monotonic()

    async def steps() -> tuple[Gathered, Gathered]:
        return await asyncio.gather(s1.complete(gathered(S1, L1)), s2.complete(whole))

    r1, r2 = asyncio.run(steps())
    assert time.monotonic() - started < 1.0  # the gradient came: no deadline waited out
    assert r2 is whole and e2.calls == [[mb(0).key]]
    assert torch.equal(e2.items[mb(0).key][1], torch.full((1, 1, 3), 0.5))  # the gradient the data holder sent L2
    assert e1.calls == [[mb(0).key, mb(1).key]] and r1.count == 4 and r1.dropped == ()
    assert torch.equal(e1.items[mb(0).key][1], 3 * torch.full((1, 1, 3), 0.5))


def test_a_stage_whose_step_lost_nothing_rebuilds_the_inputs_asked_of_it() -> None:
    """L1's sum reached S1 before L1 died, L2's died with it: S1's step lost nothing, S2 redoes microbatches 0
    and 2. Microbatch 0's input came from L1, so S2 asks stage 1 to rebuild it (``Rebuild``); S1 asks the data
    holder for its input by key, recomputes the output and pushes it up; S2 redoes both."""
    net = Net()
    s1, s2, e1, e2 = swarm(net, {L1, L2})
    whole = with_theirs(S1, L1)

    async def steps() -> tuple[Gathered, Gathered]:
        return await asyncio.gather(s1.complete(whole), s2.complete(gathered(S2, L2)))

    started = time.monotonic()
    r1, r2 = asyncio.run(steps())
    assert time.monotonic() - started < 1.0  # the input came: no deadline waited out
    assert r1 is whole and e1.calls == []
    assert e2.calls == [[mb(0).key, mb(2).key]] and r2.count == 4 and r2.dropped == ()
    x2, g2 = e2.items[mb(0).key]  # S1's recomputation of the input the data holder sent L1
    assert torch.equal(x2, 2 * torch.full((1, 1, 3), 1.0)) and torch.equal(g2, torch.full((1, 1, 3), 0.5))


def test_neighbours_dead_but_not_yet_known_dead_are_not_waited_for() -> None:
    """The victims died a moment ago: nobody has found them dead yet, so the survivors ask them too; a request
    that cannot be delivered is no answer to wait for (the redo is done at once, not after ``redo_timeout_s``)."""
    net = Net()
    s1, s2, _, _ = swarm(net, set())  # L1 and L2 run no node: nothing reaches them
    started = time.monotonic()
    r1, r2 = asyncio.run(both(s1, s2))
    assert time.monotonic() - started < 1.0 and (r1.count, r2.count) == (4, 4), (r1, r2)


def test_a_half_nobody_rebuilds_ends_at_the_deadline_and_the_rest_is_redone() -> None:
    """S2 never redoes (it is no relay with an executor here): S1 waits for microbatch 0's gradient until the
    deadline and redoes microbatch 1 alone."""
    net = Net()
    s1, _, e1, _ = swarm(net, {L1, L2})
    s2 = node(net, S2, executor=None, dead={L1, L2}, outputs=Outputs({}), table=hops(2, {1: (L1, 0.3)}))
    s1.timings = Timings(redo_timeout_s=0.3)
    started = time.monotonic()
    r1 = asyncio.run(s1.complete(gathered(S1, L1)))
    assert 0.3 <= time.monotonic() - started < 3 and e1.calls == [[mb(1).key]] and r1.count == 3
    assert s2.chain is None


def test_rebuilt_halves_come_only_from_live_relays_of_the_neighbouring_stages() -> None:
    net = Net()
    s1, s2, _, _ = swarm(net, {L1, L2})
    meta = TransferMeta(microbatch=mb(0), stage=2, tags={"redo": L1, "chain": True})
    x = torch.zeros(1, 1, 3)
    assert s2.on_tensor(S1, "forward", meta, x).accepted
    for sender, kind, why in ((DH, "forward", "from a replica of stage 1"), (L1, "forward", "from a replica"),
                              (S1, "backward", "from a replica of stage 3")):
        ack = s2.on_tensor(sender, kind, meta, x)
        assert not ack.accepted and why in ack.reason, (sender, ack)
    later = TransferMeta(microbatch=MicrobatchId(data_holder=DH, iteration=T + 2, index=0), stage=2,
                         tags={"redo": L1, "chain": True})
    assert "no chained redo" in s2.on_tensor(S1, "forward", later, x).reason
    flood = [s2.on_tensor(S1, "forward", TransferMeta(microbatch=MicrobatchId(data_holder=DH, iteration=T, index=i),
                                                      stage=2, tags={"redo": L1, "chain": True}), x).accepted
             for i in range(1, 12)]
    assert flood.count(True) == 7  # twice the iteration's 4 microbatches, at most
    holder = net.nodes[DH]
    assert "not a relay" in holder.on_tensor(S1, "backward", meta, x).reason
    assert s1.chain is not None and not s1.chain._came  # nothing pushed to S1



def test_rebuilt_halves_from_a_replica_whose_record_lapsed_are_taken_and_sent_to_joining_records() -> None:
    """Under load a neighbour's record lapses from the view for a few seconds and a member's record still
    says joining (a heartbeat late): the chain checks senders against every record the view read and sends
    to members whatever their record's state (found by the chaos test on one core)."""
    seen = {p: SimpleNamespace(peer_id=p, role=role, stage=s, state="joining" if p == S1 else "online")
            for p, (role, s) in STAGES.items()}
    live = {p: r for p, r in seen.items() if p != S2}  # S2's record lapsed
    view = SimpleNamespace(records=live, seen=seen,
                           by_stage=lambda s: [r for _, r in sorted(live.items()) if r.stage == s])
    sent: list[str] = []

    class Sender:
        async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> None:
            sent.append(peer)

    chain = Chain(L2, 2, 2, executor=FakeExecutor(), sender=Sender(), view=view, is_dead=lambda p: False,
                  compute=FakeCompute(), aggregating=lambda: T, swarm_microbatches=lambda t: 4, clock=time.monotonic)
    ack = chain.on_tensor(S2, "backward", TransferMeta(microbatch=mb(0), stage=2), torch.ones(1, 1, 3))
    assert not ack.accepted and "stage 3" in ack.reason  # from stage 3 only: the check reads S2's record
    below = Chain(S1, 1, 2, executor=FakeExecutor(), sender=Sender(), view=view, is_dead=lambda p: False,
                  compute=FakeCompute(), aggregating=lambda: T, swarm_microbatches=lambda t: 4, clock=time.monotonic)
    assert below.on_tensor(S2, "backward", TransferMeta(microbatch=mb(0), stage=1), torch.ones(1, 1, 3)).accepted
    halves = Halves(ids={mb(0).key: mb(0)}, chained={mb(0).key})
    asyncio.run(chain.push_down(halves, {mb(0).key: torch.ones(1, 1, 3)}))
    assert sent == [L1, S1]  # S1's record says joining: it gets the gradient all the same
