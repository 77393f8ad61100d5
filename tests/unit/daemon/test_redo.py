"""A lost replica's contribution redone (``datapath/redo.py``): a survivor of stage 1 asks the data holder, which
sent the lost replica its inputs and took its gradients back; the data holder answers with what it kept, and
the survivor recomputes the microbatches it got both halves of and reduces again. In memory: a fake part and
executor, the real ``HopTable`` and ``PartState``, messages delivered at once through the real wire codec."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gwtfp2p.daemon.aggregation.encoding import WireContribution
from gwtfp2p.daemon.aggregation.rounds import Gathered, Received
from gwtfp2p.daemon.aggregation.state import PartState
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.datapath.kept import Kept
from gwtfp2p.daemon.datapath.receiver import HopRecord, HopTable
from gwtfp2p.daemon.datapath.redo import LostWork
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.wire import Rebuild, Redo, Redone, decode_payload
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.transport import Ack, MicrobatchId, TransferMeta, TransportError
from tests.unit.daemon.test_aggregation_joiners import FakeCompute, FakePart

DH, SURVIVOR, LOST = "QmDataHo1der1111", "QmSurvivor222222", "QmGoneMember3333"
T = 5


def mb(index: int, iteration: int = T) -> MicrobatchId:
    return MicrobatchId(data_holder=DH, iteration=iteration, index=index)


class FakeExecutor:
    """A stage that doubles its input; ``redo`` adds each microbatch's input + gradient (rounded to integers)
    into a 3-value sum and returns three times the gradient as the input gradient."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.items: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def redo(self, origin: str, items: list[tuple[str, torch.Tensor, torch.Tensor]]
             ) -> tuple[GradContribution, dict[str, torch.Tensor]]:
        self.calls.append([key for key, _, _ in items])
        self.items.update({key: (x, g) for key, x, g in items})
        total = sum((x.reshape(-1)[:3] + g.reshape(-1)[:3]).round().to(torch.int64) for _, x, g in items)
        return GradContribution(origin, total, len(items), 10), {key: 3 * g for key, _, g in items}

    def recompute(self, mb_id: str, hidden: torch.Tensor) -> torch.Tensor:
        return 2 * hidden


class Outputs:
    """The data holder's kept outputs whose gradient came back, by who sent it (``Outbox.returned_where``)."""

    def __init__(self, kept: dict[str, list[Kept]]) -> None:
        self.kept = kept

    def returned_where(self, iteration: int, keep) -> list[tuple[str, Kept]]:
        return sorted(((peer, k) for peer, ks in self.kept.items() for k in ks
                       if k.meta.microbatch.iteration == iteration and keep(k.meta.microbatch.key, peer)),
                      key=lambda e: e[1].meta.microbatch.key)


class Net:
    def __init__(self) -> None:
        self.nodes: dict[str, LostWork] = {}
        self.silent: set[str] = set()

    def sender(self, me: str) -> Any:
        net = self

        class Sender:
            async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack | None:
                return net.nodes[peer].on_tensor(me, kind, meta, tensor) if peer in net.nodes else None  # gone

            async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None:
                if peer not in net.nodes:
                    raise TransportError(f"flow message to {peer}: failed to dial")
                if me in net.silent:
                    return
                message = decode_payload(payload)
                if isinstance(message, Redo):
                    net.nodes[peer].on_ask(me, message)
                elif isinstance(message, Redone):
                    net.nodes[peer].on_done(me, message)
                elif isinstance(message, Rebuild):
                    net.nodes[peer].on_rebuild(me, message)

        return Sender()


def view(records: dict[str, tuple[str, int]]) -> Any:
    recs = {p: SimpleNamespace(peer_id=p, role=role, stage=stage, state="online")
            for p, (role, stage) in records.items()}
    return SimpleNamespace(records=recs, seen=recs,
                           by_stage=lambda s: [r for _, r in sorted(recs.items()) if r.stage == s])


def node(net: Net, me: str, *, stage: int, outputs: Outputs | None = None, hops: HopTable | None = None,
         executor: FakeExecutor | None = None, closed_with: int | None = 4,
         counted: tuple[str, ...] | None = None) -> LostWork:
    records = {DH: ("data", 0), SURVIVOR: ("relay", 1), LOST: ("relay", 1)}
    work = LostWork(me, stage, 1, inputs_to=1, grads_to=1 if stage == 0 else 0, outbox=outputs or Outputs({}),
                    hops=HopTable() if hops is None else hops, executor=executor,
                    state=PartState(FakePart(me), T, replay_steps=0, replay_budget_bytes=0), sender=net.sender(me),
                    transport=net.sender(me), view=view(records), is_dead=lambda p: p == LOST,
                    compute=FakeCompute(), swarm_microbatches=lambda t: closed_with if t == T else None,
                    events=Events(), timings=Timings(redo_timeout_s=0.3), clock=time.monotonic,
                    counted_holders=lambda t: counted)
    net.nodes[me] = work
    return work


def gathered() -> Gathered:
    own = Received(WireContribution(SURVIVOR, torch.tensor([1, 1, 1]), 2, 10), {})
    return Gathered(T, (SURVIVOR,), {SURVIVOR: {}}, torch.zeros(3), 2, 0.0, "leader", (LOST,), 0.0, (own,), (LOST,))


def holder_state() -> tuple[Outputs, HopTable]:
    """Microbatches 0 and 2 went through LOST both ways; 1 through the survivor; 3's gradient LOST never sent
    back (its input is not among the returned ones): only 0 and 2 can be redone."""
    outputs = Outputs({LOST: [Kept(TransferMeta(microbatch=mb(i), stage=1), torch.full((1, 1, 3), 10.0 * i), None,
                                   0.0, 1.0, 1.0, 1.0) for i in (2, 0)],
                       SURVIVOR: [Kept(TransferMeta(microbatch=mb(1), stage=1), torch.ones(1, 1, 3), None, 0.0,
                                       1.0, 1.0, 1.0)]})
    tails = HopTable()
    for i, prev in ((0, LOST), (1, SURVIVOR), (2, LOST), (3, LOST)):
        record = tails.records[mb(i).key] = HopRecord(TransferMeta(microbatch=mb(i), stage=0), prev)
        record.grad = torch.full((1, 1, 3), float(i))
    tails.records[mb(0, T - 1).key] = HopRecord(TransferMeta(microbatch=mb(0, T - 1), stage=0), LOST,
                                                grad=torch.ones(1, 1, 3))  # another iteration's
    return outputs, tails


def test_a_survivor_redoes_the_lost_replicas_microbatches_and_reduces_again(caplog: pytest.LogCaptureFixture) -> None:
    net = Net()
    outputs, tails = holder_state()
    node(net, DH, stage=0, outputs=outputs, hops=tails)
    executor = FakeExecutor()
    survivor = node(net, SURVIVOR, stage=1, executor=executor)
    with caplog.at_level(logging.INFO, logger="gwtfp2p.daemon.datapath.redo"):
        result = asyncio.run(survivor.complete(gathered()))
    assert "left-out microbatches redone" not in caplog.text  # all of them: no line saying what is short
    assert executor.calls == [[mb(0).key, mb(2).key]]
    assert result.count == 4 and result.dropped == () and result.members == (SURVIVOR,)
    assert survivor.state.part.reduced == [SURVIVOR, "redone"]  # the redone sum is reduced with ours


def test_a_survivor_that_asks_after_the_neighbour_moved_on_still_gets_the_gradients() -> None:
    """The stage's norm came from a faster survivor, so the neighbour stepped (and began the next iteration)
    before this survivor's request came: the gradients it sent of the stepped iteration stay until its next
    step, and the late survivor redoes what the fast one did (before, it found nothing and stepped without
    the lost microbatches: the replicas of stage 1 diverged, a CI failure of ``test_churn_aggregation``)."""
    net = Net()
    outputs, tails = holder_state()
    tails.drop_through(T)  # the neighbour's step of T (a data holder: its next iteration began)
    node(net, DH, stage=0, outputs=outputs, hops=tails)
    executor = FakeExecutor()
    survivor = node(net, SURVIVOR, stage=1, executor=executor)
    result = asyncio.run(survivor.complete(gathered()))
    assert executor.calls == [[mb(0).key, mb(2).key]] and result.count == 4
    tails.drop_through(T + 1)  # its next step: now they are gone
    assert tails.sent_where(T, lambda _key, prev: prev != SURVIVOR) == []


def test_work_of_a_data_holder_the_iteration_did_not_keep_is_not_redone(caplog: pytest.LogCaptureFixture) -> None:
    """The data holders' aggregation left DH out (it died mid-iteration): no part counts its microbatches, so
    a survivor redoes none of them, though both halves came; its log says so."""
    net = Net()
    outputs, tails = holder_state()
    node(net, DH, stage=0, outputs=outputs, hops=tails)
    executor = FakeExecutor()
    survivor = node(net, SURVIVOR, stage=1, executor=executor, counted=("QmOtherHo1der222",))
    before = gathered()
    with caplog.at_level(logging.INFO, logger="gwtfp2p.daemon.datapath.redo"):
        assert asyncio.run(survivor.complete(before)) is before and executor.calls == []
    assert (f"stage 1 iteration {T}: 0 of 2 left-out microbatches redone (left out: ['{LOST}']): 2 inputs and 3 "
            "gradients came, 2 with both, 0 of them of a counted data holder; no answer from none") in caplog.text


def test_nothing_to_redo_leaves_the_step_as_it_was(caplog: pytest.LogCaptureFixture) -> None:
    net = Net()
    node(net, DH, stage=0)  # holds nothing of the lost replica
    survivor = node(net, SURVIVOR, stage=1, executor=FakeExecutor())
    before = gathered()
    with caplog.at_level(logging.INFO, logger="gwtfp2p.daemon.datapath.redo"):
        assert asyncio.run(survivor.complete(before)) is before
    assert "0 of 2 left-out microbatches redone" in caplog.text and "0 inputs and 0 gradients came" in caplog.text


def test_a_step_with_every_microbatch_asks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """The trigger every member sees alike: the agreed count against the data holders' (a left-out member
    alone, a joiner that did no work yet, is no reason to ask)."""
    net = Net()
    outputs, tails = holder_state()
    node(net, DH, stage=0, outputs=outputs, hops=tails)
    executor = FakeExecutor()
    survivor = node(net, SURVIVOR, stage=1, executor=executor, closed_with=2)
    before = gathered()
    with caplog.at_level(logging.INFO, logger="gwtfp2p.daemon.datapath.redo"):
        assert asyncio.run(survivor.complete(before)) is before and executor.calls == []
    assert f"stage 1 iteration {T}: ['{LOST}'] left out of the step, no microbatch missing" in caplog.text


def test_an_unanswered_request_ends_at_the_deadline() -> None:
    net = Net()
    outputs, tails = holder_state()
    node(net, DH, stage=0, outputs=outputs, hops=tails)
    net.silent.add(DH)  # its tensors arrive, its Redone never does
    executor = FakeExecutor()
    survivor = node(net, SURVIVOR, stage=1, executor=executor)
    started = time.monotonic()
    result = asyncio.run(survivor.complete(gathered()))
    assert 0.3 <= time.monotonic() - started < 5 and result.count == 4  # what came is still used


def test_requests_from_non_replicas_and_tensors_nobody_asked_for_are_refused() -> None:
    net = Net()
    outputs, tails = holder_state()
    holder = node(net, DH, stage=0, outputs=outputs, hops=tails)
    survivor = node(net, SURVIVOR, stage=1, executor=FakeExecutor())
    survivor.on_ask(DH, Redo(iteration=T, stage=1, members=(DH,)))  # a data holder is no replica of stage 1
    holder.on_ask(LOST, Redo(iteration=T, stage=1, members=(SURVIVOR,)))  # not a member of the step it asks for
    assert len(survivor.background) == 0 and len(holder.background) == 0
    ack = survivor.on_tensor(DH, "forward", TransferMeta(microbatch=mb(0), stage=1, tags={"redo": LOST}),
                             torch.zeros(1, 1, 3))
    assert not ack.accepted and "no redo" in ack.reason
