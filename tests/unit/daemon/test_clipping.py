"""Global-norm clipping's exchange (``GlobalClip``) with a fake view and transport and an injected
clock: a data holder adds every stage's squared norm to its own and tells every relay; a missing stage
is told again that the iteration is over; a late report gets the total at once; reports from peers
that are not replicas of the stage they name are ignored; a relay resends its norm until it gets the
total; a non-finite norm makes a non-finite total (the step is skipped everywhere)."""

from __future__ import annotations

import asyncio
import math

import pytest

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.datapath.clipping import KEEP_ITERATIONS, GlobalClip
from gwtfp2p.daemon.wire import PartNorm, StepNorm, decode_payload
from gwtfp2p.dht import NodeRecord
from tests.unit.daemon.fakes import DA, DB, DH, PA, PB, FakeClock

RUN = "0123456789abcdef"
TIMINGS = Timings(norm_resend_s=0.001, aggregation_timeout_s=30.0)


class View:
    def __init__(self, records: dict[str, NodeRecord]) -> None:
        self.records, self.pokes = records, 0
        self.seen = records

    def by_stage(self, stage: int) -> list[NodeRecord]:
        return [r for _, r in sorted(self.records.items()) if r.stage == stage]

    def poke(self) -> None:
        self.pokes += 1


class Transport:
    """Records what is sent; once ``answering`` is set, a data holder answers a report with the total."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []
        self.answering: GlobalClip | None = None

    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None:
        message = decode_payload(payload)
        self.sent.append((peer, message))
        if isinstance(message, PartNorm) and self.answering is not None:
            self.answering.on_step_norm(peer, StepNorm(iteration=message.iteration, total_sq_norm=None))


def record(peer: str, role: str, stage: int) -> NodeRecord:
    return NodeRecord(run_id=RUN, peer_id=peer, role=role, stage=stage, state="online")


def swarm() -> View:
    return View({DH: record(DH, "data", 0), PA: record(PA, "relay", 1), PB: record(PB, "relay", 1),
                 DA: record(DA, "relay", 2), DB: record(DB, "relay", 2)})


def test_the_data_holders_total_is_every_parts_norm_and_reaches_every_relay() -> None:
    view, transport, clock = swarm(), Transport(), FakeClock()
    holder = GlobalClip(0, 2, view=view, transport=transport, timings=TIMINGS, clock=clock)
    resent: list[set[int]] = []

    async def resend(stages: set[int]) -> None:
        resent.append(stages)
        holder.on_part_norm(DA, PartNorm(iteration=4, stage=2, sq_norm=0.25))  # stage 2 answers the reminder

    async def scenario() -> float:
        holder.on_part_norm(PA, PartNorm(iteration=4, stage=1, sq_norm=1.5))
        holder.on_part_norm(DH, PartNorm(iteration=4, stage=2, sq_norm=9.0))  # not a relay of stage 2: ignored
        total = await holder.total(4, 2.0, resend)
        holder.on_part_norm(DB, PartNorm(iteration=4, stage=2, sq_norm=0.25))  # late: answered at once
        await holder.background.join()
        return total

    assert asyncio.run(scenario()) == math.fsum([2.0, 1.5, 0.25])
    assert resent and resent[0] == {2} and view.pokes == 1
    totals = [(peer, m.total_sq_norm) for peer, m in transport.sent if isinstance(m, StepNorm)]
    assert sorted(totals) == sorted([(p, 3.75) for p in (DH, PA, PB, DA, DB)] + [(DB, 3.75)])  # DH: the other holder


def test_a_stage_that_never_answers_is_left_out_at_the_deadline() -> None:
    view, transport, clock = swarm(), Transport(), FakeClock()
    holder = GlobalClip(0, 2, view=view, transport=transport, timings=TIMINGS, clock=clock)

    async def resend(_stages: set[int]) -> None:
        clock.advance(TIMINGS.aggregation_timeout_s + 1)

    async def scenario() -> float:
        holder.on_part_norm(PA, PartNorm(iteration=0, stage=1, sq_norm=1.0))
        return await holder.total(0, 3.0, resend)

    assert asyncio.run(scenario()) == 4.0


def test_a_data_holder_missing_a_stages_norm_adopts_the_total_another_data_holder_sent() -> None:
    """A relay stops reporting once one total came back: the data holder it missed (its record lapsed in the
    relay's view) takes the other's total instead of clipping alone by a partial one at the deadline."""
    view, transport, clock = swarm(), Transport(), FakeClock()
    holder = GlobalClip(0, 2, view=view, transport=transport, timings=TIMINGS, clock=clock)
    reminders: list[set[int]] = []

    async def resend(stages: set[int]) -> None:
        reminders.append(stages)
        clock.advance(1.0)
        if len(reminders) == 3:
            holder.on_step_norm(DH, StepNorm(iteration=6, total_sq_norm=7.25))  # the other data holder's

    async def scenario() -> float:
        holder.on_part_norm(PA, PartNorm(iteration=6, stage=1, sq_norm=1.5))
        return await asyncio.wait_for(holder.total(6, 2.0, resend), 5)

    assert asyncio.run(scenario()) == 7.25 and clock() == 103.0  # three reminders, far from the deadline
    assert not [m for _, m in transport.sent if isinstance(m, StepNorm)]  # the relays had it from the other


def test_a_relay_resends_its_norm_until_a_data_holder_answers() -> None:
    view, transport = swarm(), Transport()
    relay = GlobalClip(1, 2, view=view, transport=transport, timings=TIMINGS, clock=FakeClock())

    async def scenario() -> float:
        waiting = asyncio.ensure_future(relay.total_for_stage(7, math.inf))
        while len(transport.sent) < 3:  # a few unanswered reports
            await asyncio.sleep(0)
        relay.on_step_norm(PA, StepNorm(iteration=7, total_sq_norm=1.0))  # not a data holder: ignored
        transport.answering = relay
        return await asyncio.wait_for(waiting, 5)

    total = asyncio.run(scenario())
    reports = [m for peer, m in transport.sent if peer == DH]
    assert all(m == PartNorm(iteration=7, stage=1, sq_norm=None) for m in reports)  # inf travels as None
    assert math.isnan(total) and len(reports) >= 4 and view.pokes == 1


def test_a_non_finite_part_makes_the_total_non_finite() -> None:
    transport = Transport()
    holder = GlobalClip(0, 1, view=View({DH: record(DH, "data", 0), PA: record(PA, "relay", 1)}),
                        transport=transport, timings=TIMINGS, clock=FakeClock())
    holder.on_part_norm(PA, PartNorm(iteration=1, stage=1, sq_norm=None))
    total = asyncio.run(holder.total(1, 1.0, lambda _s: asyncio.sleep(0)))
    assert math.isnan(total) and sorted(transport.sent) == sorted((p, StepNorm(iteration=1, total_sq_norm=None))
                                                                  for p in (DH, PA))
    with pytest.raises(ValueError):
        PartNorm(iteration=1, stage=1, sq_norm=-1.0)


def test_a_relay_cut_off_mid_step_clips_by_its_own_norm_once_the_data_holders_forgot_the_total() -> None:
    """The NAT test's outage: the NAT'd replica's link went down while it waited for the total of iteration 32;
    the others stepped on without it, and when it came back the data holder, at 1,196, no longer knew that
    total: the replica asked for it for four minutes and never reached the re-sync that follows a step."""
    view, transport = swarm(), Transport()
    relay = GlobalClip(1, 2, view=view, transport=transport, timings=TIMINGS, clock=FakeClock())

    async def scenario() -> tuple[bool, float]:
        view.records[DH] = view.records[DH].model_copy(update={"iteration": 32 + KEEP_ITERATIONS})
        waiting = asyncio.ensure_future(relay.total_for_stage(32, 2.5))
        while len(transport.sent) < 3:  # it still keeps the total: ask on
            await asyncio.sleep(0)
        still = not waiting.done()
        view.records[DH] = view.records[DH].model_copy(update={"iteration": 33 + KEEP_ITERATIONS})
        return still, await asyncio.wait_for(waiting, 5)

    assert asyncio.run(scenario()) == (True, 2.5)
