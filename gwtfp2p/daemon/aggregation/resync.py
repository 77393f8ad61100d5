"""Re-syncing a replica that went its own way: after an outage, or when its state hashes diverged.

A replica cut off from its stage (a partition, or its own network down) may step without the others,
who step without it: when they meet again their states differ at equal iterations. Records carry the
hashes of each node's recent steps (``NodeRecord.recent_hashes``); ``side`` (pure) compares them at
the first iteration where two replicas disagree and picks the side that keeps its state (then again
among the kept replicas at their next disagreement, if any):

1. the side furthest ahead (its most advanced replica's iteration): it kept stepping with the data
   holders, whose microbatches went through it, and the other stages stepped with those;
2. then the larger side; 3. then the side with the smallest peer id (any deterministic choice).

Every replica applies the same rule to the same records, so only the other side acts: ``Resync``
downloads the state of the winning side's most advanced replica (sha256 checked by the transport,
the state hash by the model and against the hash that replica published for that iteration), or
replays its steps, announces its membership again (``Joiner``), and resets the members, the
aggregator, the state's step log and the iteration gate. A node that was cut off (``outage``)
re-syncs before it steps again, whatever the hashes say: its peers dropped it from the aggregation.
Events: ``resync`` (why) and ``resynced`` (from whom, which iteration).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gwtfp2p.config import ConfigError
from gwtfp2p.daemon.aggregation.aggregator import Aggregator
from gwtfp2p.daemon.aggregation.joining import Joiner
from gwtfp2p.daemon.aggregation.members import MemberTable
from gwtfp2p.daemon.aggregation.state import PartState
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.swarm.view import SwarmView

logger = logging.getLogger(__name__)
RETRY_PAUSE_S = 2.0


@dataclass(frozen=True)
class Replica:
    """A replica as its record shows it: its iteration and the hashes of its recent steps."""

    peer_id: str
    iteration: int
    hashes: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Side:
    """The verdict: ``iteration``, where the replicas disagree (where ours lost, if it did); ``keep``: ours
    is kept; ``winners``: the replicas whose state is kept (ours excluded), most advanced first."""

    iteration: int
    keep: bool
    winners: tuple[str, ...]


def _split(replicas: Sequence[Replica]) -> tuple[int, list[Replica]] | None:
    """The first iteration at which ``replicas`` disagree, and the side that keeps its state there."""
    shared = sorted({i for r in replicas for i in r.hashes})
    for iteration in shared:
        groups: dict[str, list[Replica]] = defaultdict(list)
        for replica in replicas:
            if iteration in replica.hashes:
                groups[replica.hashes[iteration]].append(replica)
        if len(groups) > 1:
            ranked = sorted(groups.values(), key=lambda g: (-max(r.iteration for r in g), -len(g),
                                                            min(r.peer_id for r in g)))
            losers = {r.peer_id for g in ranked[1:] for r in g}
            return iteration, [r for r in replicas if r.peer_id not in losers]
    return None


def side(own: Replica, others: Sequence[Replica]) -> Side | None:
    """None while every two replicas that share an iteration have the same hash there; else the verdict
    for ``own``. The rule of the module docstring applies at the first iteration where any two disagree,
    again among the remaining replicas at the next one, and so on: every replica, from the same records,
    finds the same keepers, and a replica that lost copies from a keeper (most advanced first)."""
    remaining = list({r.peer_id: r for r in (own, *others)}.values())
    first, lost_at = None, None
    while (split := _split(remaining)) is not None:
        iteration, remaining = split
        first = iteration if first is None else first
        if lost_at is None and own.peer_id not in {r.peer_id for r in remaining}:
            lost_at = iteration
    if first is None:
        return None
    keepers = tuple(r.peer_id for r in sorted(remaining, key=lambda r: (-r.iteration, r.peer_id))
                    if r.peer_id != own.peer_id)
    return Side(lost_at if lost_at is not None else first, lost_at is None, keepers)


class CutOff(Protocol):
    was_cut_off: bool

    def resynced(self) -> None: ...


class Gate(Protocol):
    iteration: int

    async def advance(self, iteration: int) -> None: ...


class Resync:
    """Decides when this replica must re-sync, and does it (between two steps, from the iteration driver)."""

    def __init__(self, self_id: str, stage: int, *, view: SwarmView, own_hashes: Callable[[], list[tuple[int, str]]],
                 cut_off: CutOff, joiner: Joiner, members: MemberTable, aggregator: Aggregator, state: PartState,
                 gate: Gate, compute: ComputeThread, progress: NodeProgress, events: Events) -> None:
        self.self_id = self_id
        self.stage = stage
        self.view = view
        self.own_hashes = own_hashes
        self.cut_off = cut_off
        self.joiner = joiner
        self.members = members
        self.aggregator = aggregator
        self.state = state
        self.gate = gate
        self.compute = compute
        self.progress = progress
        self.events = events
        self.resyncs = 0

    def replicas(self) -> list[Replica]:
        return [Replica(r.peer_id, r.iteration, dict(r.recent_hashes)) for r in self.view.by_stage(self.stage)
                if r.state == "online"]

    def verdict(self) -> Side | None:
        own = Replica(self.self_id, self.gate.iteration, dict(self.own_hashes()))
        return side(own, self.replicas())

    def needed(self) -> str:
        """Why this replica must re-sync now ("" if it need not)."""
        if self.cut_off.was_cut_off:
            return "cut off from the swarm (outage)"
        found = self.verdict()
        if found is not None and not found.keep:
            return f"state diverged from {found.winners[0]} at iteration {found.iteration}"
        return ""

    async def run(self, reason: str) -> int:
        """Re-sync from the winning side (or the most advanced replica); the iteration the part is at now."""
        started = time.monotonic()
        found = self.verdict()
        prefer = found.winners if found is not None and not found.keep else ()
        self.events.emit("resync", stage=self.stage, reason=reason, iteration=self.gate.iteration,
                         sources=list(prefer))
        if self.progress.state == "online":
            self.progress.state = "joining"  # our record says so: the data holders route around us meanwhile
        if not any(r.peer_id != self.self_id for r in self.replicas()):
            logger.warning("stage %d: no other replica to re-sync with; going on from iteration %d", self.stage,
                           self.gate.iteration)
            self._back_online()
            return self.gate.iteration
        self.members.reset(self.gate.iteration, [])  # nobody dead: contributions arriving meanwhile count
        try:
            iteration = await self.joiner.join(force=True, prefer=prefer)
        except ConfigError as e:  # JoinError: no replica served a usable state this time
            logger.warning("stage %d: re-sync failed (%s); trying again", self.stage, e)
            await asyncio.sleep(RETRY_PAUSE_S)
            return self.gate.iteration
        self._verify(iteration)
        # The join hashed the state it ended with (after any replayed steps) unless it stayed at iteration 0
        state_hash = self.joiner.loaded_hash or await self.compute.run(self.state.part.state_hash)
        self.state.reset(iteration, state_hash)
        self.members.reset(iteration, self.joiner.accepted)
        self.aggregator.reset(iteration)
        await self.gate.advance(iteration)  # before the discard: later backwards of older iterations are refused
        discarded = await self.compute.run(self.state.discard_gradients)
        self._back_online()
        self.resyncs += 1
        self.events.emit("resynced", stage=self.stage, iteration=iteration, source=self.joiner.source_peer,
                         hash=state_hash, bytes=self.joiner.state_bytes, replayed_steps=self.joiner.replayed_steps,
                         discarded_backwards=discarded,
                         seconds=round(time.monotonic() - started, 4))
        return iteration

    def _back_online(self) -> None:
        self.cut_off.resynced()
        if self.progress.state == "joining":
            self.progress.state = "online"

    def _verify(self, iteration: int) -> None:
        """The downloaded state against the hash its source published for that iteration (if it did)."""
        source = next((r for r in self.replicas() if r.peer_id == self.joiner.source_peer), None)
        published = source.hashes.get(iteration - 1) if source is not None else None
        if published and self.joiner.replayed_steps == 0 and published != self.joiner.state_hash:
            logger.warning("stage %d: the state from %s hashes to %s, its record says %s for iteration %d",
                           self.stage, self.joiner.source_peer, self.joiner.state_hash, published, iteration - 1)
