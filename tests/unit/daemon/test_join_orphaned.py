"""A joiner that finds no replica of its stage in a running swarm (``Joiner._load``): it reads the DHT
again for ``Timings.orphan_confirm_s`` before restoring the stage, so records that lapsed under load
(heartbeats late on a busy machine) do not make it restart a live stage from its initial weights.

The view is a fake whose stage records come back at a given refresh; the transport serves no state
(a download attempt is what shows the joiner went to a replica instead of restoring).
"""

from __future__ import annotations

import asyncio
import time

from gwtfp2p.daemon.aggregation.joining import Joiner
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.events import Events
from gwtfp2p.dht import NodeRecord
from gwtfp2p.transport import PeerUnreachable
from tests.unit.daemon.fakes import PA, PB, pid

RUN = "c6ef4b574eecf45a"
HOLDER = pid("Hd")
STAGE = 1


def record(peer: str, stage: int, iteration: int) -> NodeRecord:
    return NodeRecord(run_id=RUN, peer_id=peer, role="data" if stage == 0 else "relay", stage=stage,
                      state="online", iteration=iteration)


class LapsingView:
    """The data holder is always seen; the stage's replicas only from the ``back_at``-th refresh on (0: never)."""

    run_id = RUN

    def __init__(self, back_at: int) -> None:
        self.back_at = back_at
        self.refreshes = 0
        self.records = {HOLDER: record(HOLDER, 0, 7)}

    async def refresh(self) -> None:
        self.refreshes += 1
        if self.back_at and self.refreshes >= self.back_at:
            self.records.update({PA: record(PA, STAGE, 7), PB: record(PB, STAGE, 6)})

    def by_stage(self, stage: int) -> list[NodeRecord]:
        return [r for _, r in sorted(self.records.items()) if r.stage == stage]


class NoStates:
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def fetch_state(self, peer: str, stage: int, **_: object) -> object:
        self.asked.append(peer)
        raise PeerUnreachable("busy", peer)


def load(back_at: int, confirm_s: float) -> tuple[int | None, Joiner, NoStates, float]:
    async def run() -> tuple[int | None, Joiner, NoStates, float]:
        transport = NoStates()
        joiner = Joiner(pid("New"), STAGE, None, view=LapsingView(back_at), transport=transport, compute=None,
                        answers=None, events=Events(), checkpoint_dir="",
                        timings=Timings(heartbeat_s=0.02, orphan_confirm_s=confirm_s))
        started = time.monotonic()
        loaded = await joiner._load(force=False)
        return loaded, joiner, transport, time.monotonic() - started

    return asyncio.run(run())


def test_replicas_that_show_up_on_a_second_look_are_downloaded_from_not_restored_over() -> None:
    loaded, joiner, transport, _ = load(back_at=3, confirm_s=5.0)
    assert transport.asked == [PA, PB]  # the most advanced first
    assert loaded is None  # neither served a state this time: the caller tries again, nothing restored
    assert joiner.source == "initial" and joiner.view.refreshes == 3


def test_a_stage_still_without_replicas_after_the_wait_is_restored_at_the_swarms_iteration() -> None:
    loaded, joiner, transport, waited_s = load(back_at=0, confirm_s=0.3)
    assert loaded == 7 and transport.asked == []  # the data holders' iteration, initial weights
    assert 0.3 <= waited_s < 3.0 and joiner.view.refreshes >= 5


def test_a_fresh_swarm_starts_at_once_from_the_initial_weights() -> None:
    async def run() -> tuple[int | None, LapsingView]:
        view = LapsingView(back_at=0)
        view.records = {}
        joiner = Joiner(pid("New"), STAGE, None, view=view, transport=NoStates(), compute=None, answers=None,
                        events=Events(), checkpoint_dir="", timings=Timings(orphan_confirm_s=60.0))
        return await asyncio.wait_for(joiner._load(force=False), 2.0), view

    loaded, view = asyncio.run(run())
    assert loaded == 0 and view.refreshes == 0


def test_a_replica_record_still_at_iteration_0_in_a_swarm_past_it_is_downloaded_from() -> None:
    """The stage's records lag its steps by up to a heartbeat: a joiner that read the replica's record of
    iteration 0 while the data holders were at 7 took the initial weights and replayed every step instead
    of downloading the replica's state (tests/integration/test_churn_replay.py failed on it in CI)."""
    async def run() -> tuple[int | None, NoStates]:
        view = LapsingView(back_at=0)
        view.records[PA] = record(PA, STAGE, 0)
        transport = NoStates()
        joiner = Joiner(pid("New"), STAGE, None, view=view, transport=transport, compute=None, answers=None,
                        events=Events(), checkpoint_dir="", timings=Timings(orphan_confirm_s=60.0))
        return await asyncio.wait_for(joiner._load(force=False), 2.0), transport

    loaded, transport = asyncio.run(run())
    assert transport.asked == [PA] and loaded is None  # it went to the replica (which was busy this time)
