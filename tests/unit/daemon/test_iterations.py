"""Both roles' barrier (``IterationDriver``) with a fake role and a fake part: the order of one
iteration (over here → reduce with the replicas → the norm to clip by → step → forget → advance →
report → checkpoint when due), later
work held while stepping, stopping, and ``Closing`` (an iteration closed by a message, by a replica's
contribution, or by every data holder's record being past it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import torch

from gwtfp2p.daemon.aggregation.checkpoint import CheckpointWriter, read
from gwtfp2p.daemon.aggregation.rounds import Gathered, Outcome
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.datapath.gate import IterationGate
from gwtfp2p.daemon.datapath.iterations import CRASH_POINT, Closing, IterationDriver
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.testing import crashpoints
from gwtfp2p.daemon.wire import Closed, decode_payload
from gwtfp2p.dht import NodeRecord
from gwtfp2p.model.trainable import StepResult
from tests.unit.daemon.fakes import DA, DH, PA, PB

RUN = "0123456789abcdef"


class Log(list):
    def add(self, *entry: Any) -> None:
        self.append(entry)


class Role:
    """Over at once for ``iterations`` iterations, then stop; logs what the driver asks."""

    def __init__(self, log: Log, gate: IterationGate, iterations: int) -> None:
        self.log, self.gate, self.iterations = log, gate, iterations

    async def until_over(self, t: int, stop: asyncio.Event, abort: asyncio.Event) -> dict | None:
        if t >= self.iterations or abort.is_set():
            return None
        self.log.add("over", t)
        return {"t": t}

    async def clip_norm(self, t: int, gathered: Gathered) -> float | None:
        self.log.add("norm", t, gathered.sq_norm)
        return 10.0 * gathered.sq_norm

    def end_iteration(self, t: int) -> None:
        self.log.add("end", t, self.gate.iteration, self.gate.aggregating)

    async def stepped(self, t: int, outcome: Outcome) -> None:
        self.log.add("stepped", t, self.gate.iteration, outcome.step.state_hash)


class Part:
    def __init__(self, log: Log, gate: IterationGate) -> None:
        self.log, self.gate, self.last_hash, self.iteration = log, gate, "", 0

    async def gather(self, iteration: int, tags: dict | None = None) -> Gathered:
        self.log.add("gather", iteration, tags, self.gate.aggregating)
        return Gathered(iteration, ("me",), {}, torch.zeros(1), 1, float(iteration), "fast", (), 0.0)

    async def step(self, gathered: Gathered, total_sq_norm: float | None) -> Outcome:
        iteration = gathered.iteration
        self.log.add("step", iteration, total_sq_norm)
        held = asyncio.ensure_future(self.gate.reach(iteration + 1, 0.01))
        await asyncio.sleep(0)
        assert not held.done() or not held.result(), "later work ran while stepping"
        self.iteration, self.last_hash = iteration + 1, f"h{iteration}"
        return Outcome(StepResult(1, 0.0, False, True, 0, self.last_hash), ("me",), {})

    def snapshot(self) -> tuple[int, bytes]:
        return self.iteration, f"state after {self.iteration}".encode()


class Compute:
    async def run(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


def test_one_loop_steps_forgets_advances_reports_and_checkpoints(tmp_path: Path) -> None:
    log, events = Log(), []

    async def scenario() -> None:
        gate = IterationGate(5)
        part = Part(log, gate)
        driver = IterationDriver(Role(log, gate, 8), gate=gate, aggregator=part, state=part, compute=Compute(),
                                 checkpoints=CheckpointWriter(str(tmp_path), RUN, 2, every=2),
                                 events=Events(events.append), stage=2)
        await driver.run(asyncio.Event(), asyncio.Event())
        await driver.background.join()

    asyncio.run(scenario())
    assert log[:6] == [("over", 5), ("gather", 5, {"t": 5}, True), ("norm", 5, 5.0), ("step", 5, 50.0),
                       ("end", 5, 5, True), ("stepped", 5, 6, "h5")]
    assert [entry[1] for entry in log if entry[0] == "stepped"] == [5, 6, 7]
    written = [e["iteration"] for e in events if e["event"] == "checkpoint"]
    assert written[0] == 6 and all(i % 2 == 0 for i in written)  # a due write is skipped while one runs
    saved = read(tmp_path, RUN, 2)
    assert saved is not None and saved.iteration == written[-1] and saved.state_hash == f"h{written[-1] - 1}"


def test_abort_ends_the_loop_without_a_step() -> None:
    log = Log()

    async def scenario() -> int:
        gate = IterationGate(0)
        abort = asyncio.Event()
        abort.set()
        part = Part(log, gate)
        driver = IterationDriver(Role(log, gate, 10), gate=gate, aggregator=part, state=part, compute=Compute(),
                                 checkpoints=CheckpointWriter("", RUN, 1, every=1), events=Events(), stage=1)
        await driver.run(asyncio.Event(), abort)
        return gate.iteration

    assert asyncio.run(scenario()) == 0 and log == []


class Seen:
    def __init__(self, iterations: set[int]) -> None:
        self.iterations = iterations

    def seen_iteration(self, iteration: int) -> bool:
        return iteration in self.iterations


class View:
    def __init__(self, records: dict[str, NodeRecord]) -> None:
        self.records = records

    def by_stage(self, stage: int) -> list[NodeRecord]:
        return [r for _, r in sorted(self.records.items()) if r.stage == stage]


class Transport:
    def __init__(self, failing: set[str]) -> None:
        self.failing, self.sent = failing, []

    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None:
        from gwtfp2p.transport import PeerUnreachable

        self.sent.append((peer, decode_payload(payload)))
        if peer in self.failing:
            raise PeerUnreachable(peer)


def record(peer: str, role: str, stage: int, iteration: int) -> NodeRecord:
    return NodeRecord(run_id=RUN, peer_id=peer, role=role, stage=stage, state="online", iteration=iteration)


def test_closing_by_message_by_a_replica_or_by_the_records() -> None:
    gate, progress = IterationGate(4), NodeProgress()
    view = View({DH: record(DH, "data", 0, 4), PA: record(PA, "relay", 1, 4), PB: record(PB, "relay", 2, 4)})
    transport = Transport(failing={PB})
    closing = Closing(gate=gate, view=view, transport=transport, aggregator=Seen({6}), progress=progress,
                      timings=Timings(retry_delays_s=(0.0,)))

    async def scenario() -> None:
        assert not closing.closed_elsewhere(4) and closing.closed_elsewhere(6)  # a replica's contribution for 6
        view.records[DH] = record(DH, "data", 0, 5)
        assert closing.closed_elsewhere(4)  # every data holder is past 4 (a lost Closed)
        closed = Closed(iteration=4, data_holders=(DH,), loss=2.5, microbatches=8, tokens_per_s=100.0)
        await closing.on_closed(closed)
        assert gate.is_closed(4) and progress.loss == 2.5
        await closing.broadcast(closed)

    asyncio.run(scenario())
    assert sorted(peer for peer, _ in transport.sent) == [PA, PB, PB]  # relays only; a failure is tried again
    assert DA not in {peer for peer, _ in transport.sent}


def test_the_contribution_crash_point_waits_for_an_iteration_with_work(monkeypatch: Any) -> None:
    """``exit_before_aggregation`` promises a lost contribution: an idle replica (no microbatch this
    iteration) does not crash there; the first iteration ≥ the armed one in which it carried work does."""
    log, hits = Log(), []
    monkeypatch.setattr(crashpoints, "ARMED", crashpoints.Fault(CRASH_POINT, 2, 5))
    monkeypatch.setattr(crashpoints, "hit", lambda point, stage, t, events: hits.append((point, stage, t)))

    class Counting(Part):
        def __init__(self, log: Log, gate: IterationGate) -> None:
            super().__init__(log, gate)
            self.part = self  # the state's part: its microbatch count this iteration
            self.count = 0

        async def step(self, gathered: Gathered, total_sq_norm: float | None) -> Outcome:
            self.count = 2 if gathered.iteration >= 6 else 0  # work from iteration 7 on
            return await super().step(gathered, total_sq_norm)

    async def scenario() -> None:
        gate = IterationGate(4)
        part = Counting(log, gate)
        driver = IterationDriver(Role(log, gate, 9), gate=gate, aggregator=part, state=part, compute=Compute(),
                                 checkpoints=CheckpointWriter("", RUN, 2, every=100), events=Events(), stage=2)
        await driver.run(asyncio.Event(), asyncio.Event())

    asyncio.run(scenario())
    assert hits == [(CRASH_POINT, 2, 7), (CRASH_POINT, 2, 8)]  # (the real hit kills the process at the first)
