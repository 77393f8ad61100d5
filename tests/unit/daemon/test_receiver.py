"""The one receive side (``HopReceiver``), as relays and the data holder's tail use it, with fakes:
new forwards and duplicates, re-pointing to a sender that replaces a lost hop (by tag, or after the
failure detector found the old one dead), the kept gradient resent without recompute, gradients that
cannot reach their hop reported upstream, and the answers to ``Where``."""

from __future__ import annotations

import asyncio

import torch

from gwtfp2p.daemon.datapath.receiver import AGAIN, NEW, OTHER, HopReceiver, HopTable
from gwtfp2p.daemon.events import Events
from gwtfp2p.transport import TransferMeta
from tests.unit.daemon.fakes import DA, DB, DH, PA, PB, FakeSender, Prober, U, mb


class Reporter:
    def __init__(self) -> None:
        self.reports: list[tuple[str, str, int]] = []

    async def report_lost(self, meta: TransferMeta, lost: str, stage: int) -> bool:
        self.reports.append((meta.microbatch.key, lost, stage))
        return True


def receiver(sender: FakeSender, prober: Prober, reporter: Reporter, events: list[dict],
             stage: int = 3) -> HopReceiver:
    """The last relay of 3 stages (``stage=3``; gradients go to stage 2) or a tail (``stage=0``)."""
    return HopReceiver(stage, 2 if stage else 3, HopTable(), sender=sender, prober=prober, reporter=reporter,
                       events=Events(events.append))


def forward(index: int, path: tuple[str, ...], **tags) -> TransferMeta:
    return TransferMeta(microbatch=mb(index), stage=3, path=path, tags=tags)


def test_new_again_and_the_gradient_goes_to_the_previous_hop() -> None:
    sender, events = FakeSender(), []
    rx = receiver(sender, Prober(), Reporter(), events)

    async def scenario() -> None:
        record, got = rx.receive(PA, forward(0, (DH, U, PA)))
        assert got == NEW and record.prev == PA and not record.done
        assert rx.receive(PA, forward(0, (DH, U, PA)))[1] == AGAIN
        record.rc = 1
        await rx.gradient_ready(mb(0).key, record, torch.ones(2))

    asyncio.run(scenario())
    ((peer, meta, grad),) = sender.backwards
    assert peer == PA and meta.stage == 2 and meta.tags == {"rc": 1} and meta.path == (DH, U, PA)
    assert torch.equal(grad, torch.ones(2)) and events == []


def test_a_sender_replacing_a_lost_hop_gets_the_kept_gradient_without_recompute() -> None:
    sender, events = FakeSender(), []
    rx = receiver(sender, Prober(), Reporter(), events)

    async def scenario() -> None:
        record, _ = rx.receive(PA, forward(0, (DH, U, PA)))
        await rx.gradient_ready(mb(0).key, record, torch.ones(2))
        _, got = rx.receive(PB, forward(0, (DH, U, PB), lost=PA))  # U resent it via PB: PA is lost
        assert got == OTHER and record.prev == PB
        await rx.background.join()

    asyncio.run(scenario())
    assert [peer for peer, _, _ in sender.backwards] == [PA, PB] and rx.gradient_resends == 1
    (event,) = events
    assert event["kind"] == "gradient_resend" and event["lost"] == PA and event["stage"] == 3


def test_without_a_lost_tag_the_record_moves_only_if_the_old_hop_is_dead() -> None:
    events: list[dict] = []
    prober = Prober()
    rx = receiver(FakeSender(), prober, Reporter(), events)

    async def scenario() -> tuple[str, str]:
        alive_record, _ = rx.receive(PA, forward(0, (DH, U, PA)))
        rx.receive(PB, forward(0, (DH, U, PB)))
        await rx.background.join()
        prober.dead.add(DA)
        dead_record, _ = rx.receive(DA, forward(1, (DH, U, DA)))
        rx.receive(DB, forward(1, (DH, U, DB)))
        await rx.background.join()
        return alive_record.prev, dead_record.prev

    assert asyncio.run(scenario()) == (PA, DB)
    assert prober.asked == [PA, DA] and [e["kind"] for e in events] == ["repoint"]


def test_a_gradient_that_cannot_reach_its_hop_is_reported_upstream_unless_re_pointed() -> None:
    sender, reporter = FakeSender(unreachable={PA}), Reporter()
    tail = receiver(sender, Prober(), reporter, [], stage=0)

    async def scenario() -> None:
        record, _ = tail.receive(PA, TransferMeta(microbatch=mb(0), stage=0, path=(DH, U, PA)))
        await tail.gradient_ready(mb(0).key, record, torch.ones(1))

    asyncio.run(scenario())
    assert reporter.reports == [(mb(0).key, PA, 0)] and sender.backwards[0][1].stage == 3


def test_where_answers_name_only_microbatches_with_the_lost_peer_on_their_path() -> None:
    table = HopTable()
    rx = HopReceiver(2, 1, table, sender=FakeSender(), prober=Prober(), reporter=Reporter(), events=Events())
    rx.receive(U, forward(0, (DH, U)))
    rx.receive(PA, forward(1, (DH, PA)))
    assert table.held(U, (mb(0), mb(1), mb(2))) == [mb(0)]
    assert table.of_holder(DH) == [mb(0).key, mb(1).key] and table.in_flight == 2
    table.drop_through(3)
    assert len(table) == 0
