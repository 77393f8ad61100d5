"""Joining a part: download its current state from a live replica and settle aggregation membership.

A node whose part (stage, or the data holders' head+tail) has replicas past iteration 0 downloads the state of the
most advanced one (size and sha256 checked by the transport, the state hash by the model) and takes part in
aggregation from that state's iteration. It tells every same-part peer (``Member``); one that already aggregated
that iteration answers *stale*, and the node reserves an iteration a little ahead and replays the steps the stage
takes up to it (``steplog``: the replicas' mean gradients, each step checked against its state hash), or downloads
again if they are no longer kept. A fresh run keeps the seeded initial weights (iteration 0). A stage with no live
replica in a running swarm (still none after a second look at the DHT: ``orphan``) is restored
from this node's local checkpoint (``--checkpoint-dir``, hash verified) or, failing that, restarts from its initial
weights; either way it enters at the swarm's current iteration (the data holders'), so the swarm goes on: that stage
lost the steps since its checkpoint (docs/churn.md). A downloaded state is loaded only with the hash a majority of
the stage's signed records announce for it (``state_check``): a replica cannot hand a joiner a state of its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection

from gwtfp2p.config import ConfigError
from gwtfp2p.daemon.aggregation.answers import AnswerBox
from gwtfp2p.daemon.aggregation.handshake import handshake, withdraw
from gwtfp2p.daemon.aggregation.orphan import confirm_orphaned, restore_checkpoint
from gwtfp2p.daemon.aggregation.state_check import agreed_hash, anchor_after
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.steps_wire import LoggedStep, decode_steps
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.daemon.testing import testpoints
from gwtfp2p.daemon.wire import WireError
from gwtfp2p.dht import NodeRecord
from gwtfp2p.model.state import StateError
from gwtfp2p.model.trainable import Trainable
from gwtfp2p.transport import RemoteError, Transport, TransportError

logger = logging.getLogger(__name__)
ATTEMPTS = 4
RESERVE_AHEAD = 2  # a stale joiner reserves the iteration this far past the replicas' current one (first try)


class JoinError(ConfigError):
    """The node could not join its part (no replica served a usable state)."""


class Joiner:
    """State download and the membership handshake of one node."""

    def __init__(self, self_id: str, stage: int, part: Trainable, *, view: SwarmView, transport: Transport,
                 compute: ComputeThread, answers: AnswerBox, events: Events, checkpoint_dir: str,
                 timings: Timings, verify_states: bool = True) -> None:
        self.self_id = self_id
        self.stage = stage
        self.part = part
        self.view = view
        self.transport = transport
        self.compute = compute
        self.answers = answers
        self.events = events
        self.checkpoint_dir = checkpoint_dir
        self.timings = timings
        self.verify_states = verify_states  # a state loads only with the hash its stage's majority announces
        # What the join loaded (the ``ready`` event reports it): initial | replica | checkpoint
        self.source = "initial"
        self.state_bytes = 0
        self.download_s = 0.0
        self.state_iteration = 0  # steps in the loaded state (a checkpoint's may lag the swarm)
        self.receiver_iteration = 0  # the most advanced iteration the last handshake's answers named
        self.replayed_steps = 0  # steps replayed after the download (the stage stepped meanwhile)
        self.accepted: list[str] = []  # same-part peers that took us as a member (they aggregate with us)
        self.prefer: frozenset[str] = frozenset()  # replicas to download from first (a re-sync's majority)
        self.state_hash = ""  # of the downloaded state (verified by the model)
        self.loaded_hash = ""  # of the state joined with (past 0): its record vouches for it before a first step
        self.source_peer = ""  # the replica it came from

    async def join(self, *, force: bool = False, prefer: Collection[str] = ()) -> int:
        """Load the part's state as needed; returns the first iteration this node aggregates. ``force``
        downloads even at iteration 0, from the replicas in ``prefer`` if any is online (a re-sync)."""
        self.prefer = frozenset(prefer)
        from_iteration = await self._join(force)
        self.loaded_hash = await self.compute.run(self.part.state_hash) if from_iteration > 0 else ""
        return from_iteration

    async def _join(self, force: bool) -> int:
        """``join``'s tries: load, handshake, else reserve an iteration ahead and replay up to it."""
        from_iteration: int | None = None
        for attempt in range(ATTEMPTS):
            if from_iteration is None and (from_iteration := await self._load(force=force or attempt > 0)) is None:
                await self.view.refresh()
                continue
            if lag := (testpoints.take("lag_join") if self.source == "replica" else None):  # tests: a download lags
                await self._wait_stage_past(from_iteration + int(lag))
            if await self._handshake(from_iteration):
                return from_iteration
            await self._withdraw(from_iteration)  # refused by one: those that took it must not wait for us
            await self.view.refresh()
            if from_iteration == 0 and self.source == "initial" and self._sources():
                from_iteration = None  # the records we read lagged a stage past 0: download (next try), not replay
                continue  # every step since 0 (each logged step carries a gradient the size of the weights)
            logger.info("stage %d moved on while joining: replaying its steps since %d", self.stage, from_iteration)
            from_iteration, reserved = await self._reserve_and_catch_up(from_iteration, RESERVE_AHEAD << attempt)
            if reserved:
                return from_iteration
        raise JoinError(f"--stage: could not catch up with stage {self.stage}'s replicas after {ATTEMPTS} tries "
                        "(each download failed, or the stage stepped before it was loaded)")

    async def _wait_stage_past(self, iteration: int, timeout_s: float = 60.0) -> None:
        """Until a replica of our stage records ``iteration`` or more (at most ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await self.view.refresh()
            if any(r.iteration >= iteration for r in self.view.by_stage(self.stage) if r.state == "online"):
                return
            await asyncio.sleep(0.2)

    async def _reserve_and_catch_up(self, from_iteration: int, ahead: int) -> tuple[int | None, bool]:
        """The replicas answered *stale*: become a member from ``ahead`` iterations past the one they are
        in (they then wait for us there; reserving the current one loses the race to a stage that steps
        faster than a round trip: ``join`` doubles ``ahead`` at every try) and replay the steps up to it
        as the stage takes them. Returns (iteration, reserved); if the reservation was refused, just
        replay what they have and try the handshake again."""
        target = max(self.receiver_iteration, from_iteration) + ahead
        if await self._handshake(target):
            if await self._catch_up(from_iteration, until=target) == target:
                return target, True
            await self._withdraw(target)  # they must not wait for us there: download again
            return None, False
        await self._withdraw(target)  # one had stepped it already: nobody may wait for us there
        return await self._catch_up(from_iteration), False

    async def _withdraw(self, iteration: int) -> None:
        """Tell who took our membership from ``iteration`` we will not be there (from 0: the next notice will)."""
        if iteration > 0 and self.accepted:
            await withdraw(self.transport, self.accepted, self.stage, iteration, self.timings.message_timeout_s)
        self.accepted = []

    async def _catch_up(self, from_iteration: int, until: int | None = None, wait_s: float | None = None) -> int | None:
        """Replay the steps a replica took since ``from_iteration`` (each checked against its state
        hash); with ``until``, up to it (excluded), polling for the last ones while the stage takes
        them (at most ``wait_s``, by default ``Timings.reserved_wait_s``: the replicas wait for us at
        ``until``). The new iteration, or None if no replica had the steps (then: download again).
        A replica that answered it keeps no steps of this stage is not asked again in this catch-up (a
        record can claim the stage far ahead of it and serve nothing: polled, it would be asked first at
        every poll)."""
        unavailable: set[str] = set()
        caught = await self._replay_kept(from_iteration, until, unavailable)
        deadline = time.monotonic() + (self.timings.reserved_wait_s if wait_s is None else wait_s)
        while until is not None and caught is not None and caught < until and time.monotonic() < deadline:
            await asyncio.sleep(self.timings.step_poll_s)
            caught = await self._replay_kept(caught, until, unavailable)
        return caught

    async def _replay_kept(self, from_iteration: int, until: int | None, unavailable: set[str]) -> int | None:
        """One pass: the steps the most advanced replica that has them all kept since ``from_iteration``
        (up to ``until``, excluded), replayed; the new iteration, or None (none had them, or a step did
        not give its hash). Replicas in ``unavailable`` are skipped; one that answers ``unavailable`` joins it."""
        sources = sorted((r for r in self.view.by_stage(self.stage)
                          if r.state == "online" and r.peer_id not in unavailable),
                         key=lambda r: (-r.iteration, r.peer_id))
        for source in sources:
            started = time.monotonic()
            try:
                fetched = await self.transport.fetch_state(source.peer_id, self.stage,
                                                           timeout_s=self.timings.fetch_timeout_s,
                                                           since_iteration=from_iteration)
                steps = decode_steps(fetched.data, first_iteration=from_iteration, numel=self.part.numel)
                steps = steps if until is None else steps[:until - from_iteration]
                await self.compute.run(self._replay, steps)
            except (TransportError, WireError) as e:
                if isinstance(e, RemoteError) and e.kind == "unavailable":
                    unavailable.add(source.peer_id)
                logger.info("no replay of stage %d from %s: %s", self.stage, source.peer_id, e)
                continue
            except StateError as e:  # a step did not give its hash: our state is unusable now
                logger.warning("replay from %s failed: %s; downloading the state again", source.peer_id, e)
                return None
            caught_up = from_iteration + len(steps)
            self.replayed_steps += len(steps)
            if steps:
                self.events.emit("replayed", source=source.peer_id, stage=self.stage, steps=len(steps),
                                 bytes=len(fetched.data), seconds=round(time.monotonic() - started, 4),
                                 iteration=caught_up)
            return caught_up
        return None

    def _replay(self, steps: list[LoggedStep]) -> None:
        """On the compute thread: apply each step as the replicas did, checking the hash after it."""
        for step in steps:
            result = self.part.apply_mean(step.mean_grad, step.count, total_sq_norm=step.total_sq_norm)
            if result.state_hash != step.state_hash:
                raise StateError(f"iteration {step.iteration}: replayed state hash {result.state_hash} "
                                 f"!= the replica's {step.state_hash}")

    async def _load(self, force: bool) -> int | None:
        """The loaded state's iteration; None if no replica served it this time (busy, gone: try again)."""
        sources = self._sources()
        if not sources and self.swarm_iteration() == 0:
            return 0
        if not sources and not (sources := await confirm_orphaned(self.view, self.stage, self._sources,
                                                                  self.timings)):
            return await self._restore(self.swarm_iteration())
        if sources[0].iteration == 0 and not force and self.swarm_iteration() == 0:
            return 0  # a fresh stage: its state is the initial weights (a record at 0 in a swarm past 0 is stale)
        for source in sources:
            self.events.emit("downloading", source=source.peer_id, stage=self.stage, iteration=source.iteration)
            started = time.monotonic()
            try:
                fetched = await self.transport.fetch_state(source.peer_id, self.stage,
                                                           timeout_s=self.timings.fetch_timeout_s)
                expected = await self._vouched(fetched.iteration)
                digest = await self.compute.run(self.part.load_state_bytes, fetched.data, expected or None)
                loaded = fetched.iteration
                if expected is None:
                    loaded, digest = await self._vouched_later(fetched.iteration)
            except (TransportError, StateError, ValueError) as e:
                logger.warning("state download from %s failed: %s", source.peer_id, e)
                continue
            if loaded is None:
                continue
            self.source, self.state_bytes, self.state_hash = "replica", len(fetched.data), digest
            self.source_peer = source.peer_id
            self.download_s, self.state_iteration = time.monotonic() - started, fetched.iteration
            logger.info("loaded stage %d state of iteration %d from %s (hash %s, %d bytes in %.2f s)", self.stage,
                        loaded, source.peer_id, digest, self.state_bytes, self.download_s)
            return loaded
        logger.warning("no replica of stage %d served its state this time", self.stage)
        return None

    def _sources(self) -> list[NodeRecord]:
        """The stage's online replicas, those in ``prefer`` first, then the most advanced."""
        return sorted((r for r in self.view.by_stage(self.stage) if r.state == "online"),
                      key=lambda r: (r.peer_id not in self.prefer, -r.iteration, r.peer_id))

    async def _vouched(self, iteration: int, wait_s: float | None = None) -> str | None:
        """The hash a state of ``iteration`` steps must have ("": not checked; None: nobody vouches for one),
        reading the view again for at most ``wait_s`` (default: 3 heartbeats) while a majority may emerge.
        A state of iteration 0 is the seeded initial one, which this node holds itself."""
        if not self.verify_states:
            return ""
        if iteration == 0:
            return await self.compute.run(self.part.state_hash)
        wait_s = 3 * self.timings.heartbeat_s if wait_s is None else wait_s
        return await agreed_hash(self.view, self.stage, iteration, wait_s=wait_s, poll_s=self.timings.heartbeat_s / 4)

    async def _vouched_later(self, iteration: int) -> tuple[int | None, str]:
        """A state of ``iteration`` steps, loaded, whose hash the records do not vouch for yet (they lag the
        state by a heartbeat and keep a replica's last steps only: a fast stage outruns them). Replay the
        stage's steps as it takes them, towards the next iteration whose hash records keep longest
        (``anchor_after``), for at most 3 heartbeats, and check the state reached against the records.
        (iteration, hash), or (None, "") if that fails (then the next source's state replaces this one)."""
        target = anchor_after(iteration)
        reached: int | None = iteration
        if target > iteration:
            reached = await self._catch_up(iteration, until=target, wait_s=3 * self.timings.heartbeat_s)
        if reached is None:
            return None, ""
        expected = await self._vouched(reached)
        digest = await self.compute.run(self.part.state_hash)
        if expected is None or (expected and digest != expected):
            logger.warning("stage %d: the state of iteration %d, replayed to %d, is not the one its replicas "
                           "announce (%s, not %s)", self.stage, iteration, reached, digest, expected)
            return None, ""
        return reached, digest

    def swarm_iteration(self) -> int:
        """The running swarm's iteration: its live data holders' (else any live node's), 0 if none."""
        holders = [r.iteration for r in self.view.by_stage(0) if r.state == "online"]
        return max(holders or [r.iteration for r in self.view.records.values()] or [0])

    async def _restore(self, swarm_iteration: int) -> int:
        """No live replica of our stage in a swarm at ``swarm_iteration``: our checkpoint, else initial weights."""
        saved = await restore_checkpoint(self.part, self.compute, self.checkpoint_dir, self.view.run_id, self.stage)
        if saved is None:
            logger.warning("stage %d had no live replica and no checkpoint here: it restarts from its initial "
                           "weights at iteration %d", self.stage, swarm_iteration)
            return swarm_iteration
        self.source, self.state_bytes, self.state_iteration = "checkpoint", len(saved.data), saved.iteration
        logger.warning("stage %d had no live replica: restored the local checkpoint of iteration %d (hash %s), "
                       "%d step(s) behind the swarm's iteration %d", self.stage, saved.iteration,
                       saved.state_hash, max(0, swarm_iteration - saved.iteration), swarm_iteration)
        return max(swarm_iteration, saved.iteration)

    async def _handshake(self, from_iteration: int) -> bool:
        """Tell same-part peers our membership (``handshake``); False if one already aggregated ``from_iteration``."""
        answers = await handshake(self.transport, self.answers, self.view.online(self.stage), self.stage,
                                  from_iteration, self.timings.message_timeout_s)
        self.receiver_iteration, self.accepted = answers.receiver_iteration, answers.accepted
        return not answers.stale
