"""Joining a part: download its current state from a live replica and settle aggregation membership.

A node whose part (stage, or the data holders' head+tail) has replicas past iteration 0 downloads
the state of the most advanced one (size and sha256 checked by the transport, the state hash by
the model) and takes part in aggregation from that state's iteration. It tells every same-part
peer (``Member``); one that already aggregated that iteration answers *stale*, and the node
reserves an iteration a little ahead and replays the steps the stage takes up to it
(``steplog.py``: the replicas' mean gradients, each step checked against its state hash), or
downloads again if they are no longer kept. A fresh
run keeps the seeded initial weights (iteration 0). A stage with no live replica in a running
swarm is restored from this node's local checkpoint (``--checkpoint-dir``, hash verified) or,
failing that, restarts from its initial weights; either way it enters at the swarm's current
iteration (the data holders'), so the swarm goes on: that stage lost the steps since its
checkpoint (docs/churn.md).
"""

from __future__ import annotations

import asyncio
import logging
import time

from gwtfp2p.config import ConfigError
from gwtfp2p.daemon import checkpoint, testpoints
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.control import Member, MemberAnswer, encode_control
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.membership import SwarmView
from gwtfp2p.daemon.steplog import LoggedStep, StepLogError, decode_steps
from gwtfp2p.model.state import StateError
from gwtfp2p.model.trainable import Trainable
from gwtfp2p.transport import Transport, TransportError

logger = logging.getLogger(__name__)
ANSWER_TIMEOUT_S = 5.0
FETCH_TIMEOUT_S = 120.0
ATTEMPTS = 4
RESERVE_AHEAD = 2  # a stale joiner reserves the iteration this far past the replicas' current one
RESERVED_WAIT_S = 30.0  # at most this long replaying up to a reserved iteration (the replicas wait there)
STEP_POLL_S = 0.05  # how often the steps the stage takes meanwhile are fetched


class JoinError(ConfigError):
    """The node could not join its part (no replica served a usable state)."""


class Joiner:
    """State download and the membership handshake of one node."""

    def __init__(self, self_id: str, stage: int, part: Trainable, view: SwarmView, transport: Transport,
                 compute: ComputeThread, events: Events | None = None, checkpoint_dir: str = "") -> None:
        self.self_id = self_id
        self.stage = stage
        self.part = part
        self.view = view
        self.transport = transport
        self.compute = compute
        self.events = events or Events()
        self.checkpoint_dir = checkpoint_dir
        self._answers: dict[str, asyncio.Future[MemberAnswer]] = {}
        # What the join loaded (the ``ready`` event reports it): initial | replica | checkpoint
        self.source = "initial"
        self.state_bytes = 0
        self.download_s = 0.0
        self.state_iteration = 0  # steps in the loaded state (a checkpoint's may lag the swarm)
        self.receiver_iteration = 0  # the most advanced iteration the last handshake's answers named
        self.replayed_steps = 0  # steps replayed after the download (the stage stepped meanwhile)
        self.accepted: list[str] = []  # same-part peers that took us as a member (they aggregate with us)

    def on_answer(self, sender: str, answer: MemberAnswer) -> None:
        future = self._answers.get(sender)
        if future is not None and not future.done() and answer.stage == self.stage:
            future.set_result(answer)

    async def join(self) -> int:
        """Load the part's state as needed; returns the first iteration this node aggregates."""
        from_iteration: int | None = None
        for attempt in range(ATTEMPTS):
            if from_iteration is None:
                from_iteration = await self._load(force=attempt > 0)
            lag = testpoints.take("lag_join") if from_iteration is not None else None  # tests only
            if lag:
                await self._wait_stage_past(from_iteration + int(lag))
            if from_iteration is not None and await self._handshake(from_iteration):
                return from_iteration
            await self.view.refresh()
            if from_iteration is not None:
                logger.info("stage %d moved on while joining: replaying its steps since %d", self.stage,
                            from_iteration)
                from_iteration, reserved = await self._reserve_and_catch_up(from_iteration)
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

    async def _reserve_and_catch_up(self, from_iteration: int) -> tuple[int | None, bool]:
        """The replicas answered *stale*: become a member from ``RESERVE_AHEAD`` iterations past the one
        they are in (they then wait for us there; reserving the current one loses the race to a stage
        that steps faster than a round trip) and replay the steps up to it as the stage takes them.
        Returns (iteration, reserved); if the reservation was refused, just replay what they have and
        try the handshake again."""
        target = max(self.receiver_iteration, from_iteration) + RESERVE_AHEAD
        if await self._handshake(target):
            if await self._catch_up(from_iteration, until=target) == target:
                return target, True
            await self._withdraw(target)  # they must not wait for us there: download again
            return None, False
        await self._withdraw(target)  # one had stepped it already: nobody may wait for us there
        return await self._catch_up(from_iteration), False

    async def _withdraw(self, iteration: int) -> None:
        payload = encode_control(Member(stage=self.stage, from_iteration=iteration, until_iteration=iteration - 1))
        for peer in self.accepted:
            try:
                await self.transport.send_flow(peer, payload, timeout_s=ANSWER_TIMEOUT_S)
            except TransportError as e:
                logger.debug("membership withdrawal to %s lost: %s", peer, e)
        self.accepted = []

    async def _catch_up(self, from_iteration: int, until: int | None = None) -> int | None:
        """Replay the steps a replica took since ``from_iteration`` (each checked against its state
        hash); with ``until``, up to it (excluded), polling for the last ones while the stage takes
        them (at most ``RESERVED_WAIT_S``: the replicas wait for us at ``until``). The new iteration,
        or None if no replica had the steps (then: download again)."""
        caught = await self._replay_kept(from_iteration, until)
        deadline = time.monotonic() + RESERVED_WAIT_S
        while until is not None and caught is not None and caught < until and time.monotonic() < deadline:
            await asyncio.sleep(STEP_POLL_S)
            caught = await self._replay_kept(caught, until)
        return caught

    async def _replay_kept(self, from_iteration: int, until: int | None) -> int | None:
        """One pass: the steps the most advanced replica that has them all kept since ``from_iteration``
        (up to ``until``, excluded), replayed; the new iteration, or None (none had them, or a step did
        not give its hash)."""
        sources = sorted((r for r in self.view.by_stage(self.stage) if r.state == "online"),
                         key=lambda r: (-r.iteration, r.peer_id))
        for source in sources:
            started = time.monotonic()
            try:
                fetched = await self.transport.fetch_state(source.peer_id, self.stage, timeout_s=FETCH_TIMEOUT_S,
                                                           since_iteration=from_iteration)
                steps = decode_steps(fetched.data, first_iteration=from_iteration, numel=self.part.numel)
                steps = steps if until is None else steps[:until - from_iteration]
                await self.compute.run(self._replay, steps)
            except (TransportError, StepLogError) as e:
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
            result = self.part.apply_mean(step.mean_grad, step.count)
            if result.state_hash != step.state_hash:
                raise StateError(f"iteration {step.iteration}: replayed state hash {result.state_hash} "
                                 f"!= the replica's {step.state_hash}")

    async def _load(self, force: bool) -> int | None:
        """The loaded state's iteration; None if no replica served it this time (busy, gone: try again)."""
        sources = sorted((r for r in self.view.by_stage(self.stage) if r.state == "online"),
                         key=lambda r: (-r.iteration, r.peer_id))
        if not sources:
            swarm_iteration = self.swarm_iteration()
            return await self._restore(swarm_iteration) if swarm_iteration > 0 else 0
        if sources[0].iteration == 0 and not force:
            return 0
        for source in sources:
            self.events.emit("downloading", source=source.peer_id, stage=self.stage, iteration=source.iteration)
            started = time.monotonic()
            try:
                fetched = await self.transport.fetch_state(source.peer_id, self.stage, timeout_s=FETCH_TIMEOUT_S)
                digest = await self.compute.run(self.part.load_state_bytes, fetched.data)
            except (TransportError, StateError, ValueError) as e:
                logger.warning("state download from %s failed: %s", source.peer_id, e)
                continue
            self.source, self.state_bytes = "replica", len(fetched.data)
            self.download_s, self.state_iteration = time.monotonic() - started, fetched.iteration
            logger.info("loaded stage %d state of iteration %d from %s (hash %s, %d bytes in %.2f s)", self.stage,
                        fetched.iteration, source.peer_id, digest, self.state_bytes, self.download_s)
            return fetched.iteration
        logger.warning("no replica of stage %d served its state this time", self.stage)
        return None

    def swarm_iteration(self) -> int:
        """The running swarm's iteration: its live data holders' (else any live node's), 0 if none."""
        holders = [r.iteration for r in self.view.by_stage(0) if r.state == "online"]
        return max(holders or [r.iteration for r in self.view.records.values()] or [0])

    async def _restore(self, swarm_iteration: int) -> int:
        """No live replica of our stage in a swarm at ``swarm_iteration``: our checkpoint, else initial weights."""
        saved = None
        if self.checkpoint_dir:
            try:
                saved = checkpoint.read(self.checkpoint_dir, self.view.run_id, self.stage)
                if saved is not None:
                    await self.compute.run(self.part.load_state_bytes, saved.data, saved.state_hash)
            except (checkpoint.CheckpointError, StateError, ValueError) as e:
                logger.error("checkpoint of stage %d not usable: %s", self.stage, e)
                saved = None
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
        """Tell same-part peers our membership; False if one already aggregated ``from_iteration``."""
        peers = [r.peer_id for r in self.view.by_stage(self.stage) if r.state == "online"]
        loop = asyncio.get_running_loop()
        self._answers = {p: loop.create_future() for p in peers}
        payload = encode_control(Member(stage=self.stage, from_iteration=from_iteration))
        for peer in peers:
            try:
                await self.transport.send_flow(peer, payload, timeout_s=ANSWER_TIMEOUT_S)
            except TransportError as e:
                logger.debug("membership notice to %s lost: %s", peer, e)
                self._answers[peer].cancel()
        waiting = [f for f in self._answers.values() if not f.cancelled()]
        if waiting:
            await asyncio.wait(waiting, timeout=ANSWER_TIMEOUT_S)
        answers = {p: f.result() for p, f in self._answers.items() if f.done() and not f.cancelled()}
        answered = {p: answer.accepted for p, answer in answers.items()}
        self.receiver_iteration = max((a.receiver_iteration for a in answers.values()), default=from_iteration)
        self._answers = {}
        self.accepted = sorted(p for p, accepted in answered.items() if accepted)
        return all(answered.values())
