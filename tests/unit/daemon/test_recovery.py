"""Crash recovery of the data plane with fakes and an injected clock: the outbox's deadlines and
completions, and ``Recovery`` deciding which outputs are resent, where, with which tags (a forward
failure vs. a rejoin of the node downstream that still holds the microbatch), and what it reports."""

from __future__ import annotations

import asyncio

import pytest
import torch

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.datapath.outbox import Outbox
from gwtfp2p.daemon.datapath.recovery import Recovery
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.daemon.testing.crashpoints import Fault
from gwtfp2p.daemon.timeouts import Deadlines
from gwtfp2p.daemon.wire import Held, Lost, Where, WireError, decode_payload, encode_recovery
from gwtfp2p.transport import TransferMeta
from tests.unit.daemon.fakes import DA, DB, DH, PA, PB, FakeClock, FakeNetwork, FakeSender, U, mb

TIMINGS = Timings()


def relay_recovery(network: FakeNetwork, sender: FakeSender, events: list[dict],
                   clock: FakeClock | None = None) -> Recovery:
    """A stage-1 relay (U) of a 3-stage pipeline: next hops are stage 2 (PA, PB), then stage 3 (DA, DB)."""
    def other(meta: TransferMeta, tried: set[str]) -> Hop | None:
        return next((Hop(p, "") for p in (PA, PB) if p not in tried and p not in network.dead), None)

    outbox = Outbox(1, 3, sender=sender, other_hop=other, round_trips=network.round_trip_model,
                    deadlines=Deadlines(TIMINGS), events=Events(events.append), clock=clock or FakeClock(),
                    retry_nobody_s=TIMINGS.retry_nobody_s)
    recovery = Recovery(U, outbox, network=network, held_here=lambda _lost, _mbs: [], deadlines=Deadlines(TIMINGS),
                        check_s=TIMINGS.deadline_check_s)
    network.recovery = recovery
    return recovery


async def sent_two(recovery: Recovery) -> None:
    for index in (0, 1):
        meta = TransferMeta(microbatch=mb(index), stage=2, path=(DH, U))
        await recovery.outbox.send(meta, torch.zeros(1), Hop(PA, f"u{index}"))


def test_recovery_messages_round_trip_and_reject_garbage() -> None:
    for message in (Lost(microbatch=mb(1), lost=PA, stage=3), Where(microbatches=(mb(1), mb(2)), lost=PA),
                    Held(microbatches=(), lost=PA, stage=0)):
        assert decode_payload(encode_recovery(message)) == message
    for bad in (b"R{}", b"R" + b'{"kind": "lost", "lost": "x"}', b"Xjunk",
                encode_recovery(Held(microbatches=(), lost=PA, stage=0))[:-1] + b', "extra": 1}'):
        with pytest.raises(WireError):
            decode_payload(bad)


def test_crash_points_parse_and_match() -> None:
    fault = Fault.parse("exit_after_forward:1:3")
    assert fault.matches("exit_after_forward", 1, 3) and fault.matches("exit_after_forward", 1, 9)
    assert not fault.matches("exit_after_forward", 1, 2) and not fault.matches("exit_after_forward", 2, 3)
    assert not fault.matches("exit_before_backward", 1, 3)
    for bad in ("exit_after_forward:1", "nap:1:2", "exit_after_forward:x:2"):
        with pytest.raises(ValueError):
            Fault.parse(bad)


def test_forward_failure_resends_to_another_replica_without_rejoin() -> None:
    network = FakeNetwork({PA: 2, PB: 2, DA: 3, DB: 3, DH: 0}, dead={PA})
    sender, events = FakeSender(), []
    recovery = relay_recovery(network, sender, events)

    async def scenario() -> None:
        await sent_two(recovery)
        await recovery.peer_dead(PA)

    asyncio.run(scenario())
    resends = sender.sent[2:]
    assert [hop.peer for hop, _ in resends] == [PB, PB]
    for _, meta in resends:
        assert meta.tags == {"lost": PA, "from": U} and meta.attempt == 1
    wheres = [peer for peer, m in network.messages if isinstance(m, Where)]
    assert sorted(wheres) == [DA, DB, DH]  # everyone downstream of the lost stage, the tail included
    outbox = recovery.outbox
    assert all(outbox.get(k).kind == "forward_resend" for k in (mb(0).key, mb(1).key))
    assert recovery.resends == 2
    back = TransferMeta(microbatch=mb(0), stage=1, tags={"rc": 1})
    assert outbox.backward_arrived(mb(0).key, back) and not outbox.backward_arrived(mb(0).key, back)
    (event,) = events
    assert event["kind"] == "forward_resend" and event["recomputed_hops"] == 1 and event["lost"] == PA


def test_backward_failure_rejoins_the_nearest_holder() -> None:
    """DA (stage 3) and the tail both hold microbatch 0: the resend is routed to rejoin DA; microbatch 1
    is held by nobody (it never got past PA): a plain forward failure."""
    network = FakeNetwork({PA: 2, PB: 2, DA: 3, DB: 3, DH: 0}, holds={DA: {mb(0).key}, DH: {mb(0).key}},
                          dead={PA})
    sender = FakeSender()
    recovery = relay_recovery(network, sender, [])

    async def scenario() -> None:
        await sent_two(recovery)
        await recovery.peer_dead(PA)

    asyncio.run(scenario())
    by_key = {meta.microbatch.key: (hop, meta) for hop, meta in sender.sent[2:]}
    hop0, meta0 = by_key[mb(0).key]
    assert hop0.peer == PB and meta0.tags == {"lost": PA, "from": U, "rejoin": True, "then.3": DA}
    assert by_key[mb(1).key][1].tags == {"lost": PA, "from": U}
    assert recovery.outbox.get(mb(0).key).kind == "backward_resend"
    assert recovery.outbox.get(mb(0).key).hint == DA


def test_lost_notice_resends_at_once_with_the_reporter_as_holder() -> None:
    network = FakeNetwork({PA: 2, PB: 2, DA: 3, DH: 0}, dead=set())
    sender = FakeSender()
    recovery = relay_recovery(network, sender, [])

    async def scenario() -> None:
        await sent_two(recovery)
        network.dead.add(PA)
        await recovery.on_message(DA, Lost(microbatch=mb(0), lost=PA, stage=3))

    asyncio.run(scenario())
    assert PA in network.suspected
    by_key = {meta.microbatch.key: meta for _, meta in sender.sent[2:]}
    assert by_key[mb(0).key].tags["then.3"] == DA and by_key[mb(0).key].tags["rejoin"] is True
    assert "rejoin" not in by_key[mb(1).key].tags  # also through PA: resent too, no holder


def test_lost_notice_about_a_hop_that_answers_our_probe_resends_that_microbatch_only() -> None:
    """Under load a reporter's gradient can fail to reach a live hop (it was refused, or the dial timed out):
    the claim is checked with our own probe, and only the reported microbatch is redone; the others the hop
    holds stay with it (resending them too made two replicas count them: found by the chaos test on one core)."""
    network = FakeNetwork({PA: 2, PB: 2, DA: 3, DH: 0}, dead=set())
    sender = FakeSender()
    recovery = relay_recovery(network, sender, [])

    async def scenario() -> None:
        await sent_two(recovery)
        await recovery.on_message(DA, Lost(microbatch=mb(0), lost=PA, stage=3))

    asyncio.run(scenario())
    resent = [(hop.peer, meta.microbatch.key) for hop, meta in sender.sent[2:]]
    assert resent == [(PB, mb(0).key)]
    assert sender.sent[2][1].tags["then.3"] == DA and recovery.outbox.get(mb(1).key).hop.peer == PA


def test_a_late_gradient_probes_the_next_hop_and_waits_longer_if_it_answers() -> None:
    clock = FakeClock()
    network = FakeNetwork({PA: 2, PB: 2})
    sender = FakeSender()
    recovery = relay_recovery(network, sender, [], clock)

    async def scenario() -> tuple[float, float, bool]:
        await sent_two(recovery)
        kept = recovery.outbox.get(mb(0).key)
        before, deadline = kept.wait_s, kept.deadline_at
        clock.now = deadline - 0.01
        recovery.check()
        early = len(recovery.background) == 0  # nothing due yet
        clock.now = deadline + 0.01
        recovery.check()
        await recovery.background.join()
        return before, kept.wait_s, early

    before, after, early = asyncio.run(scenario())
    assert early and after == 2 * before and len(sender.sent) == 2  # PA answered: nothing resent

    clock2 = FakeClock()
    network2 = FakeNetwork({PA: 2, PB: 2}, dead={PA})
    sender2 = FakeSender()
    recovery2 = relay_recovery(network2, sender2, [], clock2)

    async def dead_scenario() -> None:
        await sent_two(recovery2)
        clock2.now = recovery2.outbox.get(mb(0).key).deadline_at + 0.01
        recovery2.check()
        await recovery2.background.join()

    asyncio.run(dead_scenario())
    assert [hop.peer for hop, _ in sender2.sent[2:]] == [PB, PB]


def test_an_output_nobody_took_is_offered_again_after_its_retry_pause() -> None:
    clock = FakeClock()
    network = FakeNetwork({PA: 2, PB: 2})
    sender = FakeSender(refuse={PA, PB})
    recovery = relay_recovery(network, sender, [], clock)

    async def scenario() -> list:
        await sent_two(recovery)
        assert recovery.outbox.get(mb(0).key).hop is None
        sender.refuse.clear()
        clock.advance(TIMINGS.retry_nobody_s + 0.01)
        recovery.check()
        await recovery.background.join()
        return [recovery.outbox.get(mb(i).key).hop for i in (0, 1)]

    assert [hop.peer for hop in asyncio.run(scenario())] == [PA, PA]


def test_report_lost_walks_up_past_dead_hops() -> None:
    network = FakeNetwork({}, dead={U})
    outbox = relay_recovery(network, FakeSender(), []).outbox
    recovery = Recovery(DB, outbox, network=network, held_here=lambda _l, _m: [], deadlines=Deadlines(TIMINGS),
                        check_s=1.0)  # the last relay, whose gradient cannot reach PA
    meta = TransferMeta(microbatch=mb(0), stage=3, path=(DH, U, PA))

    assert asyncio.run(recovery.report_lost(meta, PA, 3))
    notices = [(peer, m) for peer, m in network.messages if isinstance(m, Lost)]
    assert notices == [(U, Lost(microbatch=mb(0), lost=PA, stage=3)), (DH, Lost(microbatch=mb(0), lost=U, stage=3))]
    assert network.suspected == [PA]


def test_the_outbox_measures_round_trips_and_its_deadline_follows_them() -> None:
    clock = FakeClock()
    network = FakeNetwork({PA: 2})
    recovery = relay_recovery(network, FakeSender(), [], clock)
    outbox = recovery.outbox

    async def scenario() -> None:
        for index in range(3):
            await outbox.send(TransferMeta(microbatch=mb(index), stage=2, path=(DH, U)), torch.zeros(1), Hop(PA, ""))
            clock.advance(5.0)
            assert outbox.backward_arrived(mb(index).key, TransferMeta(microbatch=mb(index), stage=1))

    asyncio.run(scenario())
    assert outbox.round_trip.value == pytest.approx(5.0) and len(outbox) == 0
    wait_s, expected_s = outbox.deadline(Hop(PA, ""))
    assert expected_s == pytest.approx(5.0) and wait_s == pytest.approx(TIMINGS.timeout_factor * 5.0)
