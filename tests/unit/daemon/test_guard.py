"""The inbox's guard with fakes: who may send what (by their records), what is malformed (a typed error),
and when a claim that a peer died is believed."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import pytest
import torch

from gwtfp2p.daemon.lifecycle.guard import Guard, Shape
from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.daemon.wire import Closed, Member
from gwtfp2p.transport import MicrobatchId, ProtocolError, TransferMeta
from tests.unit.daemon.fakes import DH, PA, PB, U, pid

pytestmark = pytest.mark.timeout(30)
MALLORY, NEXT = pid("Mxry"), pid("Next")
STAGES = {DH: 0, PA: 0, U: 1, PB: 1, NEXT: 2}  # PA: a second data holder


class Peers:
    def get(self, peer: str) -> object | None:
        return STAGES.get(peer)

    def serves(self, peer: str, stage: int) -> bool:
        return STAGES.get(peer) == stage


@dataclass
class Kept:
    hop: Hop | None
    output: torch.Tensor


class View:
    rounds = 0

    def poke(self) -> None:
        self.rounds += 1


class Prober:
    def __init__(self, alive: set[str]) -> None:
        self.alive_peers = alive

    async def alive(self, peer: str) -> bool:
        return peer in self.alive_peers


def guard(kept: dict | None = None, alive: set[str] = frozenset()) -> Guard:
    return Guard(U, 1, 2, Shape(2, 4, 8, torch.float32, 4), peers=Peers(), kept=kept or {}, prober=Prober(set(alive)),
                 view=View(), iteration=lambda: 5, refresh_s=0.0, silent_after_s=30.0)


def forward(sender: str = DH, iteration: int = 5, index: int = 0, holder: str = DH, stage: int = 1,
            tensor: torch.Tensor | None = None, g: Guard | None = None):
    meta = TransferMeta(microbatch=MicrobatchId(data_holder=holder, iteration=iteration, index=index), stage=stage)
    return (g or guard()).forward(sender, meta, torch.zeros(2, 4, 8) if tensor is None else tensor)


def test_forwards_from_the_previous_stage_of_this_iteration_pass() -> None:
    assert forward() is None and forward(sender=PA, iteration=7) is None


@pytest.mark.parametrize("case", ["stranger", "wrong_stage", "far_future"])
def test_forwards_are_refused(case: str) -> None:
    ack = {"stranger": lambda: forward(sender=MALLORY), "wrong_stage": lambda: forward(stage=2),
           "far_future": lambda: forward(iteration=8)}[case]()
    assert ack is not None and not ack.accepted and ack.reason


@pytest.mark.parametrize("tensor", [torch.zeros(2, 4, 9), torch.zeros(2, 4, 8, dtype=torch.int64), torch.zeros(0),
                                    torch.full((2, 4, 8), math.nan), torch.zeros(2, 256, 8)])
def test_malformed_forwards_get_a_typed_error(tensor: torch.Tensor) -> None:
    with pytest.raises(ProtocolError):
        forward(sender=MALLORY, tensor=tensor)  # whoever sends it


def test_microbatches_of_strangers_or_out_of_range_are_malformed() -> None:
    for kwargs in ({"holder": MALLORY}, {"index": 4}):
        with pytest.raises(ProtocolError):
            forward(**kwargs)


def test_backwards_come_from_the_next_hop() -> None:
    out = torch.zeros(2, 4, 8)
    g = guard({f"{DH}/5/0": Kept(Hop(PB, "u"), out)})
    meta = TransferMeta(microbatch=MicrobatchId(data_holder=DH, iteration=5, index=0), stage=1)
    assert g.backward(PB, meta, out) is None
    assert g.backward(NEXT, meta, out) is None  # another replica of the next stage (a recovery re-pointed it)
    assert not g.backward(MALLORY, meta, out).accepted
    assert not guard().backward(MALLORY, meta, out).accepted  # nothing kept: still only from the next stage
    assert guard().backward(NEXT, meta, out) is None  # a duplicate the data path answers
    with pytest.raises(ProtocolError):
        g.backward(PB, meta, torch.zeros(2, 4))


def test_closed_only_from_data_holders_for_now() -> None:
    g = guard()
    assert g.closed(DH, Closed(iteration=5, data_holders=(DH,)))
    assert g.closed(PA, Closed(iteration=6, data_holders=(PA,)))
    assert not g.closed(MALLORY, Closed(iteration=5, data_holders=(DH,)))
    assert not g.closed(DH, Closed(iteration=8, data_holders=(DH,)))


def test_members_need_a_record_of_the_part() -> None:
    g = guard()
    assert asyncio.run(g.member(PB, Member(stage=1, from_iteration=6)))
    assert not asyncio.run(g.member(MALLORY, Member(stage=1, from_iteration=6)))
    assert not asyncio.run(g.member(NEXT, Member(stage=1, from_iteration=6)))


def test_a_claim_that_a_peer_died_needs_our_own_evidence() -> None:
    g = guard(alive={PB})
    assert not asyncio.run(g.claims_hold(MALLORY, [PB], "query"))  # PB answers us
    assert asyncio.run(g.claims_hold(MALLORY, [NEXT], "query"))  # NEXT does not
    assert asyncio.run(g.claims_hold(MALLORY, [PB], "query", silent_s=lambda p: 31.0))  # silent to us too
