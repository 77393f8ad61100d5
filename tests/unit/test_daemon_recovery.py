"""Crash-recovery bookkeeping of the data plane, without a network: dead peers and their revival, the
kept-output table, the recovery messages, the crash points, and ``Upstream`` (``recovery.py``) driven
with a fake sender and a fake ``Network``: which outputs are resent, where, with which tags (a forward
failure vs. a rejoin of the node downstream that still holds the microbatch), and what it reports."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
import torch

from gwtfp2p.daemon.crashpoints import Fault
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.kept import KeptTable
from gwtfp2p.daemon.liveness import DeadPeers
from gwtfp2p.daemon.recovery import Upstream, report_lost
from gwtfp2p.daemon.recovery_wire import (
    Held,
    Lost,
    RecoveryWireError,
    Where,
    decode_recovery,
    encode_recovery,
    is_recovery,
)
from gwtfp2p.daemon.routing import Hop
from gwtfp2p.daemon.timeouts import RoundTripModel
from gwtfp2p.transport import MicrobatchId, TransferMeta


def pid(name: str) -> str:
    return "12D3KooW" + name.ljust(10, "x")


DH, U, PA, PB, DA, DB, T = (pid(n) for n in ("Dh", "U", "Pa", "Pb", "Da", "Db", "T"))


def mb(index: int, holder: str = DH) -> MicrobatchId:
    return MicrobatchId(data_holder=holder, iteration=3, index=index)


# -- pure bookkeeping ------------------------------------------------------------------------------
def test_a_dead_peer_stays_dead_until_a_newer_heartbeat() -> None:
    dead = DeadPeers()
    assert dead.seen(PA, 10.0)
    assert dead.declare(PA) and not dead.declare(PA) and dead.is_dead(PA)
    assert not dead.seen(PA, 10.0)  # its lingering record
    assert dead.is_dead(PA)
    assert dead.seen(PA, 12.0) and not dead.is_dead(PA)  # it heartbeats again: alive
    assert dead.declare(PB) and dead.is_dead(PB) and not dead.seen(PB, 0.0) and len(dead) == 1


def test_kept_table_deadlines_resends_and_completions() -> None:
    table = KeptTable()
    meta = TransferMeta(microbatch=mb(0), stage=2)
    table.add("a", meta, "out-a", Hop(PA, "u1"), now=0.0, wait_s=2.0, expected_s=0.5)
    table.add("b", meta, "out-b", Hop(PB, "u2"), now=0.0, wait_s=5.0, expected_s=0.5)
    assert [k for k, _ in table.due(1.0)] == [] and [k for k, _ in table.due(2.0)] == ["a"]
    table.extend("a", now=2.0)  # it answered a probe: 4 s more
    assert [k for k, _ in table.due(5.5)] == ["b"] and [k for k, _ in table.due(6.0)] == ["a", "b"]
    assert table.via(PA) == ["a"]
    table.failed("a", 6.0)
    table.resent("a", meta, Hop(PB, ""), PA, "forward_resend", now=6.1, wait_s=2.0)
    assert table.via(PB) == ["a", "b"] and table.get("a").resends == 1
    done = table.complete("a", now=7.0)
    assert done is not None and done.resent and done.kind == "forward_resend" and done.lost == PA
    assert done.round_trip_s == 7.0 and done.extra_s == pytest.approx(6.5) and done.detect_s == 6.0
    plain = table.complete("b", now=1.0)
    assert plain is not None and not plain.resent and plain.extra_s == 0.0
    assert table.complete("b", now=1.0) is None and len(table) == 0


def test_recovery_messages_round_trip_and_reject_garbage() -> None:
    for message in (Lost(microbatch=mb(1), lost=PA, stage=3), Where(microbatches=(mb(1), mb(2)), lost=PA),
                    Held(microbatches=(), lost=PA, stage=0)):
        payload = encode_recovery(message)
        assert is_recovery(payload) and decode_recovery(payload) == message
    for bad in (b"R{}", b"R" + b'{"kind": "lost", "lost": "x"}', b"Cjunk",
                encode_recovery(Held(microbatches=(), lost=PA, stage=0))[:-1] + b', "extra": 1}'):
        with pytest.raises(RecoveryWireError):
            decode_recovery(bad)


def test_crash_points_parse_and_match() -> None:
    fault = Fault.parse("exit_after_forward:1:3")
    assert fault.matches("exit_after_forward", 1, 3) and fault.matches("exit_after_forward", 1, 9)
    assert not fault.matches("exit_after_forward", 1, 2) and not fault.matches("exit_after_forward", 2, 3)
    assert not fault.matches("exit_before_backward", 1, 3)
    for bad in ("exit_after_forward:1", "nap:1:2", "exit_after_forward:x:2"):
        with pytest.raises(ValueError):
            Fault.parse(bad)


# -- Upstream with fakes ---------------------------------------------------------------------------
@dataclass
class FakeSender:
    refuse: set[str] = field(default_factory=set)
    sent: list[tuple[Hop | None, TransferMeta]] = field(default_factory=list)

    async def forward_with_failover(self, hop, meta, tensor, other):
        tried: set[str] = set()
        while hop is not None and hop.peer in self.refuse:
            tried.add(hop.peer)
            hop = other(tried)
        self.sent.append((hop, meta))
        return hop


@dataclass
class FakeNetwork:
    """Peers by stage; ``holds`` answers ``Where`` (peer -> keys it holds); ``dead`` peers fail."""

    stages: dict[str, int]
    holds: dict[str, set[str]] = field(default_factory=dict)
    dead: set[str] = field(default_factory=set)
    upstream: Upstream | None = None
    messages: list[tuple[str, object]] = field(default_factory=list)
    suspected: list[str] = field(default_factory=list)

    def is_dead(self, peer: str) -> bool:
        return peer in self.dead

    async def alive(self, peer: str) -> bool:
        return peer not in self.dead

    def suspect(self, peer: str) -> None:
        self.suspected.append(peer)

    def candidates(self, stages: set[int]) -> list[str]:
        return sorted(p for p, s in self.stages.items() if s in stages and p not in self.dead)

    def rtt(self, peer: str) -> float | None:
        return 0.001

    def round_trip_model(self, peer: str, hops: int, queue_depth: int) -> RoundTripModel:
        return RoundTripModel(hops, 0.001, 0.001, queue_depth)

    async def send_recovery(self, peer: str, message) -> bool:
        self.messages.append((peer, message))
        if peer in self.dead:
            return False
        if isinstance(message, Where) and self.upstream is not None:
            held = tuple(m for m in message.microbatches if m.key in self.holds.get(peer, set()))
            answer = Held(microbatches=held, lost=message.lost, stage=self.stages.get(peer, 0))
            asyncio.get_running_loop().call_soon(
                lambda: asyncio.ensure_future(self.upstream.on_message(peer, answer)))
        return True


def relay_upstream(network: FakeNetwork, sender: FakeSender, events: list[dict]) -> Upstream:
    """A stage-1 relay (U) of a 3-stage pipeline: next hops are stage 2 (PA, PB), then stage 3 (DA, DB)."""
    def other(meta: TransferMeta, tried: set[str]) -> Hop | None:
        return next((Hop(p, "") for p in (PA, PB) if p not in tried and p not in network.dead), None)

    upstream = Upstream(U, 1, 3, sender, other)
    upstream.network, upstream.events = network, Events(events.append)
    network.upstream = upstream
    return upstream


async def sent_two(upstream: Upstream) -> None:
    for index in (0, 1):
        meta = TransferMeta(microbatch=mb(index), stage=2, path=(DH, U))
        await upstream.send(meta, torch.zeros(1), Hop(PA, f"u{index}"))


def test_forward_failure_resends_to_another_replica_without_rejoin() -> None:
    network = FakeNetwork({PA: 2, PB: 2, DA: 3, DB: 3, DH: 0}, dead={PA})
    sender, events = FakeSender(), []
    upstream = relay_upstream(network, sender, events)

    async def scenario() -> None:
        await sent_two(upstream)
        await upstream.peer_dead(PA)

    asyncio.run(scenario())
    resends = sender.sent[2:]
    assert [hop.peer for hop, _ in resends] == [PB, PB]
    for _, meta in resends:
        assert meta.tags == {"lost": PA, "from": U} and meta.attempt == 1
    wheres = [peer for peer, m in network.messages if isinstance(m, Where)]
    assert sorted(wheres) == [DA, DB, DH]  # everyone downstream of the lost stage, the tail included
    assert all(upstream.table.get(k).kind == "forward_resend" for k in (mb(0).key, mb(1).key))
    back = TransferMeta(microbatch=mb(0), stage=1, tags={"rc": 1})
    assert upstream.backward_arrived(mb(0).key, back) and not upstream.backward_arrived(mb(0).key, back)
    (event,) = events
    assert event["kind"] == "forward_resend" and event["recomputed_hops"] == 1 and event["lost"] == PA


def test_backward_failure_rejoins_the_nearest_holder() -> None:
    """DA (stage 3) and the tail both hold microbatch 0: the resend is routed to rejoin DA; microbatch 1
    is held by nobody (it never got past PA): a plain forward failure."""
    network = FakeNetwork({PA: 2, PB: 2, DA: 3, DB: 3, DH: 0}, holds={DA: {mb(0).key}, DH: {mb(0).key}},
                          dead={PA})
    sender, events = FakeSender(), []
    upstream = relay_upstream(network, sender, events)

    async def scenario() -> None:
        await sent_two(upstream)
        await upstream.peer_dead(PA)

    asyncio.run(scenario())
    by_key = {meta.microbatch.key: (hop, meta) for hop, meta in sender.sent[2:]}
    hop0, meta0 = by_key[mb(0).key]
    assert hop0.peer == PB and meta0.tags == {"lost": PA, "from": U, "rejoin": True, "then.3": DA}
    assert by_key[mb(1).key][1].tags == {"lost": PA, "from": U}
    assert upstream.table.get(mb(0).key).kind == "backward_resend"
    assert upstream.table.get(mb(0).key).hint == DA


def test_lost_notice_resends_at_once_with_the_reporter_as_holder() -> None:
    network = FakeNetwork({PA: 2, PB: 2, DA: 3, DH: 0}, dead=set())
    sender, events = FakeSender(), []
    upstream = relay_upstream(network, sender, events)

    async def scenario() -> None:
        await sent_two(upstream)
        network.dead.add(PA)
        await upstream.on_message(DA, Lost(microbatch=mb(0), lost=PA, stage=3))

    asyncio.run(scenario())
    assert PA in network.suspected
    by_key = {meta.microbatch.key: meta for _, meta in sender.sent[2:]}
    assert by_key[mb(0).key].tags["then.3"] == DA and by_key[mb(0).key].tags["rejoin"] is True
    assert "rejoin" not in by_key[mb(1).key].tags  # also through PA: resent too, no holder


def test_a_late_gradient_probes_the_next_hop_and_waits_longer_if_it_answers() -> None:
    network = FakeNetwork({PA: 2, PB: 2})
    sender, events = FakeSender(), []
    upstream = relay_upstream(network, sender, events)

    async def scenario() -> tuple[float, float]:
        await sent_two(upstream)
        kept = upstream.table.get(mb(0).key)
        before = kept.wait_s
        upstream._check(kept.deadline_at + 0.01)
        await asyncio.sleep(0.05)
        return before, kept.wait_s

    before, after = asyncio.run(scenario())
    assert after == 2 * before and len(sender.sent) == 2  # PA answered: nothing resent

    network2 = FakeNetwork({PA: 2, PB: 2}, dead={PA})
    sender2 = FakeSender()
    upstream2 = relay_upstream(network2, sender2, [])

    async def dead_scenario() -> None:
        await sent_two(upstream2)
        upstream2._check(upstream2.table.get(mb(0).key).deadline_at + 0.01)
        await asyncio.sleep(0.2)

    asyncio.run(dead_scenario())
    assert [hop.peer for hop, _ in sender2.sent[2:]] == [PB, PB]


def test_report_lost_walks_up_past_dead_hops() -> None:
    network = FakeNetwork({}, dead={U})
    sender = FakeSender()
    local = Upstream(DB, 3, 3, sender, lambda _m, _t: None)
    meta = TransferMeta(microbatch=mb(0), stage=3, path=(DH, U, PA))

    async def scenario() -> bool:
        return await report_lost(network, local, meta, PA, 3)

    assert asyncio.run(scenario())
    notices = [(peer, m) for peer, m in network.messages if isinstance(m, Lost)]
    assert notices == [(U, Lost(microbatch=mb(0), lost=PA, stage=3)), (DH, Lost(microbatch=mb(0), lost=U, stage=3))]
    assert network.suspected == [PA]


def test_distances_order_holders_down_to_the_tail() -> None:
    upstream = Upstream(U, 1, 3, FakeSender(), lambda _m, _t: None)
    assert upstream.lost_stage == 2
    assert upstream._distance(3) == 1 and upstream._distance(0) == 2  # stage 3, then the tail
    head = Upstream(DH, 0, 2, FakeSender(), lambda _m, _t: None)
    assert head.lost_stage == 1 and head._distance(2) == 1 and head._distance(0) == 2
    last = Upstream(T, 2, 2, FakeSender(), lambda _m, _t: None)
    assert last.lost_stage == 0
