"""Pure parts of the daemon: aggregation membership, a data holder's iteration ledger and unit
assignment, link estimates and edge costs, the control-message codec, the swarm as a flow instance."""

from __future__ import annotations

import math

import pytest

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.aggregation.members import MemberTable
from gwtfp2p.daemon.datapath.ledger import IterationLedger, assign_units
from gwtfp2p.daemon.swarm.instance import instance_from_records, routing_cost
from gwtfp2p.daemon.swarm.links import Ema, LinkTable, activation_bytes
from gwtfp2p.daemon.wire import (
    Closed,
    Member,
    MemberAnswer,
    WireError,
    decode_payload,
    encode_control,
    encode_flow,
)
from gwtfp2p.dht import LinkStats, NodeRecord, RouteSummary, run_id_of
from gwtfp2p.flow.costs import edge_cost_s
from gwtfp2p.flow.messages import Accept, Advert

A, B, C, D = ("12D3KooWA" + "a" * 8, "12D3KooWB" + "b" * 8, "12D3KooWC" + "c" * 8, "12D3KooWD" + "d" * 8)


def test_member_table_expected_by_iteration() -> None:
    table = MemberTable(B, from_iteration=0)
    assert table.add(A, 0)
    assert not table.add(A, 0)
    table.add(C, 3)
    assert table.expected(0) == [A, B]
    assert table.expected(3) == [A, B, C]
    table.set_until(A, 4)
    assert table.expected(4) == [A, B, C]
    assert table.expected(5) == [B, C]
    table.remove(C)
    table.remove(B)  # never removes itself
    assert table.expected(5) == [B] and table.peers() == [A]


def test_ledger_closes_when_every_head_backward_is_done() -> None:
    ledger = IterationLedger(iteration=2, n_microbatches=3)
    for i in range(3):
        ledger.sent(i, f"u{i}", "relay")
    assert ledger.tail_done(0, 5.0) and not ledger.tail_done(0, 4.0)
    assert ledger.tail_done(2, 3.0)
    assert ledger.head_done(0) and not ledger.head_done(0) and not ledger.head_done(7)
    assert not ledger.closed
    ledger.tail_done(1, 1.0)
    ledger.head_done(1)
    ledger.head_done(2)
    assert ledger.closed and ledger.done == 3
    assert ledger.losses() == {0: 5.0, 1: 1.0, 2: 3.0} and ledger.loss_sum().total == 9.0


def test_assign_units_round_robin() -> None:
    assert assign_units([], 4) == []
    assert assign_units(["a", "b"], 5) == ["a", "b", "a", "b", "a"]
    assert assign_units(["a", "b", "c"], 2) == ["a", "b"]


def test_link_table_costs_and_hysteresis() -> None:
    ema = Ema(0.5)
    assert ema.get(7.0) == 7.0 and ema.add(2.0) == 2.0 and ema.add(4.0) == 3.0 and ema.add(math.nan) == 3.0
    ema.cap(5.0, default=7.0)
    assert ema.get() == 3.0  # already below
    ema.cap(1.5, default=7.0)
    assert ema.get() == 1.5 and ema.samples == 2
    fresh = Ema(0.5)
    fresh.cap(9.0, default=7.0)
    assert fresh.value is None  # the default is below the bound: nothing learnt
    links = LinkTable(default_bandwidth_bytes_per_s=1e8)
    assert links.edge_cost(A, 0.01, 0.02, 1000) is None
    links.observe_rtt(A, 0.04)
    links.observe_transfer(A, 1000, 1.0)  # too small to say anything about bandwidth
    assert links.bandwidth(A) == 1e8
    links.observe_transfer(A, 2**20, 0.04 + 2**20 / 5e7)
    assert links.bandwidth(A) == pytest.approx(5e7)
    expected = edge_cost_s(0.01, 0.02, 0.02, 0.02, 5e7, 5e7, 4096)
    assert links.edge_cost(A, 0.01, 0.02, 4096) == pytest.approx(expected)
    assert links.peers() == [A]
    links.forget(A)
    assert links.rtt(A) is None
    assert activation_bytes(2, 16, 32) == 4096


def test_control_codec_round_trip_and_rejects_garbage() -> None:
    for message in (Member(stage=2, from_iteration=5, until_iteration=9),
                    MemberAnswer(stage=0, from_iteration=5, accepted=False, receiver_iteration=6),
                    Closed(iteration=3, data_holders=(A, B), loss=4.5, microbatches=8, tokens_per_s=12.0)):
        assert decode_payload(encode_control(message)) == message
    flow = [Advert(A, ((B, math.inf),), 3), Accept(A, ("x#1", "x#2"))]
    assert decode_payload(encode_flow(flow)) == flow
    for bad in (b"", b"X{}", b"C{}", b'C{"kind":"member","stage":-1,"from_iteration":0}', b"F{nope",
                b'C{"kind":"closed","iteration":1,"data_holders":["not a peer id!"]}'):
        with pytest.raises(WireError):
            decode_payload(bad)


def _record(peer: str, stage: int, run_id: str, **fields) -> NodeRecord:
    return NodeRecord(run_id=run_id, peer_id=peer, role="data" if stage == 0 else "relay", stage=stage,
                      state="online", **fields)


def test_swarm_instance_from_records_and_routing_cost() -> None:
    spec = RunSpec(n_stages=2, microbatch_size=2, seq_len=16, microbatches_per_dh=4)
    run = run_id_of(spec)
    records = {
        A: _record(A, 0, run, compute_s=0.001, links={B: LinkStats(rtt_s=0.02)},
                   routing=(RouteSummary(next_peer=B, sink=A, units=4),)),
        B: _record(B, 1, run, capacity=8, compute_s=0.003, links={C: LinkStats(rtt_s=0.04)},
                   routing=(RouteSummary(next_peer=C, sink=A, units=4),)),
        C: _record(C, 2, run, capacity=8, compute_s=0.002, links={A: LinkStats(rtt_s=0.06)},
                   routing=(RouteSummary(next_peer=A, sink=A, units=4),)),
        D: _record(D, 1, run, capacity=2),
    }
    instance = instance_from_records(spec, records, default_bandwidth=1e9)
    assert {n.node_id for n in instance.nodes} == {A, B, C, D}
    assert instance.node(A).supply == 4 and instance.node(B).capacity == 8
    size = 2 * 16 * 32 * 4
    assert instance.cost(A, B) == pytest.approx(edge_cost_s(0.001, 0.003, 0.01, 0.01, 1e9, 1e9, size))
    assert instance.cost(D, C) is None  # nobody measured that link
    flow, total = routing_cost(instance, records)
    assert flow == 4
    assert total == pytest.approx(4 * (instance.cost(A, B) + instance.cost(B, C) + instance.cost(C, A)))
