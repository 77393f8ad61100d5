"""The iteration barrier of both roles: wait until an iteration is over here, step with the replicas, go on.

``IterationDriver`` runs one loop for relays and data holders: the role says when iteration t is
over at this node (a relay: the data holders closed it; a data holder: all its microbatches are back)
and what its contribution carries; the part reduces with its replicas (a relay redoes the work of members
left out: ``redo``), the role finds the norm to clip by (``clipping``), the part steps (the iteration gate
holds later work meanwhile), the role reports the step, and a local checkpoint is written when due.
``Closing`` carries the data holders' ``Closed`` message to the relays.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from gwtfp2p.daemon.aggregation.checkpoint import CheckpointWriter
from gwtfp2p.daemon.aggregation.rounds import Gathered, Outcome
from gwtfp2p.daemon.aggregation.state import PartState
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.datapath.gate import IterationGate
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.testing import crashpoints
from gwtfp2p.daemon.wire import Closed, encode_control
from gwtfp2p.transport import TransportError

logger = logging.getLogger(__name__)
KEEP_CLOSED = 8  # iterations whose microbatch count is kept (``Closing.microbatches``)


CRASH_POINT = "exit_before_aggregation"  # test fault: our contribution dies with us (armed in tests only)


class IterationRole(Protocol):
    async def until_over(self, t: int, stop: asyncio.Event, abort: asyncio.Event) -> dict[str, Any] | None:
        """Wait until iteration ``t`` is over at this node: the tags our contribution carries, None to stop."""
        ...

    async def clip_norm(self, t: int, gathered: Gathered) -> float | None:
        """The whole model's squared norm to clip ``t`` by (None: the part clips by its own)."""
        ...

    def end_iteration(self, t: int) -> None:
        """The step of ``t`` is done (before later work may run): forget its per-iteration state."""
        ...

    async def stepped(self, t: int, outcome: Outcome) -> None:
        """Report the step of ``t``."""
        ...


class PartStep(Protocol):
    async def gather(self, iteration: int, tags: dict[str, Any] | None = None) -> Gathered: ...
    async def step(self, gathered: Gathered, total_sq_norm: float | None) -> Outcome: ...


class Redoing(Protocol):
    async def complete(self, gathered: Gathered) -> Gathered: ...


class Resyncing(Protocol):
    def needed(self) -> str: ...

    async def run(self, reason: str) -> int: ...


class IterationDriver:
    """One part's loop of iterations, whatever the role; a replica that went its own way re-syncs
    between two steps (``resync``: after an outage, or when its state diverged), never steps alone then."""

    def __init__(self, role: IterationRole, *, gate: IterationGate, aggregator: PartStep, state: PartState,
                 compute: ComputeThread, checkpoints: CheckpointWriter, events: Events, stage: int,
                 resync: Resyncing | None = None, redo: Redoing | None = None) -> None:
        self.role = role
        self.gate = gate
        self.aggregator = aggregator
        self.state = state
        self.compute = compute
        self.checkpoints = checkpoints
        self.events = events
        self.stage = stage
        self.resync = resync  # None: this part never re-syncs (data holders)
        self.redo = redo  # None: members left out of a step are not redone (data holders)
        self.background = Background("checkpoints")

    async def run(self, stop: asyncio.Event, abort: asyncio.Event) -> None:
        """Iterate until the role says stop (``stop``: no new iteration; ``abort``: drop the current one)."""
        while True:
            if self.resync is not None and (reason := self.resync.needed()):
                self.role.end_iteration(await self.resync.run(reason) - 1)
            t = self.gate.iteration
            tags = await self.role.until_over(t, stop, abort)
            if tags is None:
                return
            if self.resync is not None and self.resync.needed():
                continue  # not this step: re-sync first (above)
            if crashpoints.armed_at(CRASH_POINT, self.stage, t) and self.state.part.count:  # work to lose
                crashpoints.hit(CRASH_POINT, self.stage, t, self.events)
            await self.gate.begin_step()
            try:
                gathered = await self.aggregator.gather(t, tags)
                if self.redo is not None:
                    gathered = await self.redo.complete(gathered)
                outcome = await self.aggregator.step(gathered, await self.role.clip_norm(t, gathered))
            finally:
                self.role.end_iteration(t)
                await self.gate.advance(t + 1)
            await self.role.stepped(t, outcome)
            await self._checkpoint(t + 1)

    async def _checkpoint(self, steps: int) -> None:
        """Write the part's state after ``steps`` steps to --checkpoint-dir if due (in a thread)."""
        writer = self.checkpoints
        if not writer.due(steps):
            return
        iteration, data = await self.compute.run(self.state.snapshot)
        state_hash = self.state.last_hash

        async def save() -> None:
            started = time.monotonic()
            path = await asyncio.to_thread(writer.save, iteration, state_hash, data)
            self.events.emit("checkpoint", stage=self.stage, iteration=iteration, hash=state_hash, bytes=len(data),
                             seconds=round(time.monotonic() - started, 4), path=str(path))

        self.background.spawn(save(), f"checkpoint {iteration}")

    async def close(self) -> None:
        await self.background.close()


class ControlSender(Protocol):
    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None: ...


class SeenIteration(Protocol):
    def seen_iteration(self, iteration: int) -> bool: ...


class Closing:
    """The end of an iteration as the data holders announce it and the relays learn it."""

    def __init__(self, *, gate: IterationGate, view: SwarmView, transport: ControlSender, aggregator: SeenIteration,
                 progress: NodeProgress, timings: Timings) -> None:
        self.gate = gate
        self.view = view
        self.transport = transport
        self.aggregator = aggregator
        self.progress = progress
        self.timings = timings
        self._microbatches: dict[int, int] = {}  # iteration -> the microbatches the data holders closed it with
        self._members: dict[int, tuple[str, ...]] = {}  # iteration -> the data holders its aggregation kept

    async def on_closed(self, closed: Closed) -> None:
        """A data holder closed ``closed.iteration`` (a relay learns the swarm's figures with it)."""
        self.progress.loss, self.progress.tokens_per_s = closed.loss, closed.tokens_per_s
        self._microbatches[closed.iteration] = closed.microbatches
        self._members[closed.iteration] = closed.data_holders
        for old in [t for t in self._microbatches if t < closed.iteration - KEEP_CLOSED]:
            del self._microbatches[old]
            self._members.pop(old, None)
        await self.gate.close(closed.iteration)

    def microbatches(self, t: int) -> int | None:
        """The swarm's microbatches of iteration ``t`` as the data holders closed it (None: not heard)."""
        return self._microbatches.get(t)

    def data_holders(self, t: int) -> tuple[str, ...] | None:
        """The data holders whose contributions the data holders' aggregation of ``t`` kept (None: not heard):
        every part counts the microbatches of these, and of no other."""
        return self._members.get(t)

    def closed_elsewhere(self, t: int) -> bool:
        """Iteration t is closed if a same-stage replica already sent its contribution for it, or every
        live data holder's record is past it (a lost ``Closed`` message)."""
        holders = self.view.by_stage(0)
        return self.aggregator.seen_iteration(t) or (bool(holders) and all(r.iteration > t for r in holders))

    async def broadcast(self, closed: Closed, stages: set[int] | None = None) -> None:
        """A data holder tells every relay (of ``stages``: all if None) that ``closed.iteration`` is over."""
        self.progress.loss, self.progress.tokens_per_s = closed.loss, closed.tokens_per_s
        payload = encode_control(closed)
        relays = [p for p, r in self.view.records.items()
                  if r.role == "relay" and (stages is None or r.stage in stages)]
        await asyncio.gather(*(self._send(p, payload) for p in relays))

    async def _send(self, peer: str, payload: bytes) -> None:
        for delay in (*self.timings.retry_delays_s, None):
            try:
                await self.transport.send_flow(peer, payload, timeout_s=self.timings.message_timeout_s)
                return
            except TransportError as e:
                if delay is None:
                    logger.warning("control message to %s lost: %s", peer, e)
                    return
                await asyncio.sleep(delay)
