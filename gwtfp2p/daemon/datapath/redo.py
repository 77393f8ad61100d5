"""Work a step leaves out, redone: every survivor recomputes what a dead (or left-out) replica contributed.

A replica that dies after its backwards and before its part's aggregation takes its gradient sum with it;
the agreement leaves it out. Every member sees that alike: fewer microbatches agreed than the data holders
closed the iteration with. What the replica computed from is still held by its neighbours, whose step waits
for this part's norm (global clipping): the stage below (or the data holder's head) keeps every output whose
gradient came back, with who sent it (``Outbox.returned_where``); the stage above (or the data holder's
tail) every gradient it sent, with where (``HopTable.sent_where``). Each member asks them for the work of
replicas outside the step's members (``wire.Redo``); they send the inputs as forwards and the gradients as
backwards (each in the run's codec for its kind: the bytes the replica decoded) tagged ``redo``, then
``wire.Redone``. The member recomputes every microbatch it got both halves of (``StageExecutor.redo``: the
bits the replica added) and screens and reduces again. Every member gets the same answers, so the same sum;
one that misses an answer by ``redo_timeout_s`` steps without it (the state check re-syncs it). Where the
neighbour that held a half died too, the survivors of both stages rebuild the halves (``redo_chain``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from gwtfp2p.daemon.aggregation import admission as vet
from gwtfp2p.daemon.aggregation.rounds import Gathered, Received
from gwtfp2p.daemon.aggregation.state import PartState
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.datapath.outbox import Outbox
from gwtfp2p.daemon.datapath.receiver import HopTable
from gwtfp2p.daemon.datapath.redo_chain import CHAIN_TAG, REDO_TAG, Chain, Halves, Redoable, TensorSender
from gwtfp2p.daemon.datapath.redo_serve import Serving
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.wire import MAX_MICROBATCHES, Rebuild, Redo, Redone, encode_control
from gwtfp2p.transport import Ack, MicrobatchId, TransferMeta, TransportError

logger = logging.getLogger(__name__)
REDONE_ORIGIN = "redone"  # the redone sum's name among the step's contributions (no peer id looks like it)


def is_redo(meta: TransferMeta) -> bool:
    return isinstance(meta.tags.get(REDO_TAG), str)


class ControlSender(Protocol):
    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None: ...


@dataclass
class _Asked:
    """One survivor's request for the work its step leaves out: who has not answered yet, what came."""

    waiting: set[str]
    halves: Halves = field(default_factory=Halves)
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # an answer completed


class LostWork:
    """Both sides for one node: answering ``Redo`` (every node) and redoing left-out work (relays: ``executor``
    set). ``inputs_to``/``grads_to``: the stages our outputs and our gradients go to; ``swarm_microbatches``:
    the microbatches the data holders closed an iteration with (None: not known here); ``counted_holders``: the
    data holders whose microbatches it counts (``Closing.data_holders``; None: all): work of others is not
    redone, as no part counts it."""

    def __init__(self, self_id: str, stage: int, n_stages: int, *, inputs_to: int, grads_to: int, outbox: Outbox,
                 hops: HopTable, executor: Redoable | None, state: PartState, sender: TensorSender,
                 transport: ControlSender, view: SwarmView, is_dead: Callable[[str], bool], compute: ComputeThread,
                 swarm_microbatches: Callable[[int], int | None], events: Events, timings: Timings,
                 clock: Callable[[], float],
                 counted_holders: Callable[[int], tuple[str, ...] | None] = lambda _t: None) -> None:
        self.self_id, self.stage, self.n_stages = self_id, stage, n_stages
        self.inputs_to, self.grads_to = inputs_to, grads_to
        self.outbox, self.hops, self.executor, self.state = outbox, hops, executor, state
        self.sender, self.transport, self.view, self.is_dead = sender, transport, view, is_dead
        self.compute, self.swarm_microbatches, self.counted_holders = compute, swarm_microbatches, counted_holders
        self.events, self.timings, self.clock = events, timings, clock
        self.background = Background("redo")
        self._asked: dict[int, _Asked] = {}
        self.chain = self.serving = None
        if executor is not None:
            self.chain = Chain(self_id, stage, n_stages, executor=executor, sender=sender, view=view, is_dead=is_dead,
                               compute=compute, aggregating=lambda: state.iteration,
                               swarm_microbatches=swarm_microbatches, clock=clock, ask_down=self._ask_rebuild)
            self.serving = Serving(stage, chain=self.chain, executor=executor, compute=compute, collect=self._collect,
                                   aggregating=lambda: state.iteration, background=self.background,
                                   max_asked=lambda t: swarm_microbatches(t) or MAX_MICROBATCHES)
            self.chain.on_input = self.serving.poke

    # -- a neighbour: answering -------------------------------------------------------------------
    def on_ask(self, sender: str, ask: Redo) -> None:
        record = self.view.seen.get(sender)  # a lapsed record still names its stage
        if record is None or record.role != "relay" or record.stage != ask.stage or sender not in ask.members:
            logger.info("redo request from %s refused: not a member of stage %d's step", sender, ask.stage)
            return
        self.background.spawn(self._answer(sender, ask), f"redo for {sender}")

    async def _answer(self, sender: str, ask: Redo) -> None:
        t, members, keys = ask.iteration, set(ask.members), {m.key for m in ask.microbatches}
        def keep(key: str, who: str) -> bool:  # the keys asked for, else all that went to none of the members
            return key in keys if keys else who not in members

        returned, sent = self.outbox.returned_where(t, keep), self.hops.sent_where(t, keep)
        inputs = [(whose, k.meta, k.output) for whose, k in returned] if ask.stage == self.inputs_to else []
        grads = [(r.prev, r.meta, r.grad) for r in sent] if ask.stage == self.grads_to else []
        went = {}
        for kind, items in (("forward", inputs), ("backward", grads)):
            acks = await asyncio.gather(*(
                self.sender.send(kind, sender, TransferMeta(microbatch=meta.microbatch, stage=ask.stage,
                                                            tags={REDO_TAG: whose}), tensor)
                for whose, meta, tensor in items))
            went[kind] = sum(1 for ack in acks if ack is not None and ack.accepted)
        done = Redone(iteration=t, stage=ask.stage, inputs=went["forward"], grads=went["backward"])
        with contextlib.suppress(TransportError):
            await self.transport.send_flow(sender, encode_control(done), timeout_s=self.timings.message_timeout_s)

    # -- a survivor: redoing -----------------------------------------------------------------------
    def on_tensor(self, sender: str, kind: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        if meta.tags.get(CHAIN_TAG) is True:
            if self.chain is None:
                return Ack(accepted=False, reason="no chained redo here (not a relay)")
            return self.chain.on_tensor(sender, kind, meta, tensor)
        asked = self._asked.get(meta.microbatch.iteration)
        whose = meta.tags.get(REDO_TAG)
        if asked is None or sender not in asked.waiting or meta.stage != self.stage or not isinstance(whose, str):
            return Ack(accepted=False, reason="no redo asked of you for this")
        asked.halves.add(kind, meta, tensor, whose)
        return Ack()

    def on_done(self, sender: str, done: Redone) -> None:
        asked = self._asked.get(done.iteration)
        if asked is not None and done.stage == self.stage:
            asked.waiting.discard(sender)
            asked.changed.set()

    def on_rebuild(self, sender: str, ask: Rebuild) -> None:
        """The stage above redoes and lacks inputs a dead replica of ours computed (``redo_serve``)."""
        record = self.view.seen.get(sender)
        if self.serving is None or record is None or record.role != "relay" or ask.stage != self.stage + 1 \
                or record.stage != ask.stage:
            logger.info("rebuild request from %s refused: we feed no stage %d it serves", sender, ask.stage)
            return
        self.serving.on_rebuild(ask.iteration, ask.microbatches)

    async def _ask_rebuild(self, t: int, ids: tuple[MicrobatchId, ...]) -> None:
        """Ask the stage below to rebuild the inputs of ``ids`` (their replica there sent its sum and died)."""
        payload = encode_control(Rebuild(iteration=t, stage=self.stage, microbatches=ids[:MAX_MICROBATCHES]))
        peers = sorted(r.peer_id for r in self.view.by_stage(self.stage - 1)
                       if r.role == "relay" and not self.is_dead(r.peer_id))
        for peer in peers:
            with contextlib.suppress(TransportError):
                await self.transport.send_flow(peer, payload, timeout_s=self.timings.message_timeout_s)

    def _wanted(self, gathered: Gathered) -> int | None:
        """How many microbatches the step leaves out: fewer agreed than the data holders closed the iteration
        with (the same answer on every member); None where that number is not known (then: redo if a member
        was left out)."""
        total = self.swarm_microbatches(gathered.iteration)
        return None if total is None else max(0, total - sum(r.contribution.count for r in gathered.received))

    async def complete(self, gathered: Gathered) -> Gathered:
        """``gathered`` with the work of the replicas its step leaves out redone (unchanged if there is none)."""
        wanted = self._wanted(gathered)
        if self.executor is None or self.chain is None:
            return gathered
        if wanted == 0 or (wanted is None and not gathered.lost):
            if gathered.lost:
                logger.info("stage %d iteration %d: %s left out of the step, no microbatch missing: nothing to "
                            "redo", self.stage, gathered.iteration, sorted(gathered.lost))
            self.serving.open(gathered.iteration, gathered.members)
            return gathered
        started, t = self.clock(), gathered.iteration
        try:
            halves, unanswered = await self._collect(t, gathered.members)
            if halves.inputs.keys() ^ halves.grads.keys() or self.chain.came_for(t):  # a half died with another
                await self.chain.fill(t, halves, wanted, self.clock() + self.timings.redo_timeout_s)
        finally:
            self.chain.forget(t)
        self.serving.open(t, gathered.members)  # halves the neighbours' redo wants of us, from now on
        counted = self.counted_holders(t)
        keys = [k for k in halves.complete() if counted is None or halves.ids[k].data_holder in counted]
        if wanted is None or len(keys) < wanted:
            _log_short(self.stage, gathered, wanted, halves, keys, unanswered)
        if not keys:
            return gathered
        codec, executor = self.state.codec, self.executor
        items = [(k, halves.inputs[k], halves.grads[k]) for k in keys]
        try:
            contribution, grads_in = await self.compute.run(executor.redo, REDONE_ORIGIN, items)
            redone = await self.compute.run(codec.encode, contribution)
        except ValueError as e:
            logger.warning("stage %d iteration %d: left-out work not redone: %s", self.stage, t, e)
            return gathered
        await self.chain.push_down(halves, grads_in)
        whose = {halves.whose[k] for k in keys if halves.whose.get(k)}
        logger.info("stage %d iteration %d: %d microbatches of %s redone", self.stage, t, len(items), sorted(whose))
        self.events.emit("recovery", kind="contribution_redone", microbatch=None, stage=self.stage, iteration=t,
                         replicas=sorted(whose), microbatches=len(items), unanswered=unanswered,
                         rebuilt=len(halves.rebuilt & set(keys)), recomputed_hops=len(items),
                         extra_s=round(self.clock() - started, 4))
        return await self._reduce_again(gathered, Received(redone, {}), whose)

    async def _collect(self, t: int, members: tuple[str, ...], microbatches: tuple[MicrobatchId, ...] = (),
                       side: str = "both") -> tuple[Halves, list[str]]:
        """Ask the neighbours (``side``: "below", "above" or "both") for the work of ``t`` done by none of
        ``members`` (or for ``microbatches``, whoever did them): what they kept of it (by key, with whose work it
        was) and the neighbours that did not answer within ``redo_timeout_s``."""
        below = 0 if self.stage == 1 else self.stage - 1
        above = 0 if self.stage == self.n_stages else self.stage + 1
        stages = {"below": (below,), "above": (above,), "both": (below, above)}[side]
        peers = {r.peer_id for s in stages for r in self.view.by_stage(s)
                 if r.state != "joining" and not self.is_dead(r.peer_id)} - {self.self_id}
        asked = self._asked[t] = _Asked(peers)  # a joiner holds nothing of ``t`` (and answers nothing yet)
        try:
            payload = encode_control(Redo(iteration=t, stage=self.stage, members=members, microbatches=microbatches))
            await asyncio.gather(*(self._ask(asked, p, payload) for p in sorted(peers)))
            deadline = self.clock() + self.timings.redo_timeout_s
            while asked.waiting and self.clock() < deadline:
                asked.changed.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asked.changed.wait(), deadline - self.clock())
            return asked.halves, sorted(asked.waiting)
        finally:
            del self._asked[t]

    async def _ask(self, asked: _Asked, peer: str, payload: bytes) -> None:
        try:
            await self.transport.send_flow(peer, payload, timeout_s=self.timings.message_timeout_s)
        except TransportError as e:  # gone (dead, not yet known dead): no answer to wait for
            logger.info("redo request to %s lost: %s", peer, e)
            asked.waiting.discard(peer)

    async def _reduce_again(self, gathered: Gathered, redone: Received, whose: set[str]) -> Gathered:
        """Screen and reduce the agreed contributions and the redone one, as if the left-out had sent theirs."""
        state, t = self.state, gathered.iteration
        used, excluded = await self.compute.run(vet.screen_received, state.codec, [*gathered.received, redone],
                                                state.screen_factor)
        news = {peer: reason for peer, reason in excluded.items() if peer not in gathered.dropped}
        vet.report_excluded(self.events, self.stage, t, news)
        mean, count, sq_norm = await self.compute.run(state.reduce, [r.contribution for r in used])
        back = set() if REDONE_ORIGIN in excluded else whose
        dropped = tuple(sorted((set(gathered.dropped) - back) | set(excluded)))
        return dataclasses.replace(gathered, mean=mean, count=count, sq_norm=sq_norm, dropped=dropped)

    async def close(self) -> None:
        await self.background.close()


def _log_short(stage: int, gathered: Gathered, wanted: int | None, halves: Halves, keys: list[str],
               unanswered: list[str]) -> None:
    """Why a step's left-out work is not all redone: what was wanted and which halves came (one INFO line)."""
    logger.info("stage %d iteration %d: %d of %s left-out microbatches redone (left out: %s): %d inputs and %d "
                "gradients came, %d with both, %d of them of a counted data holder; no answer from %s",
                stage, gathered.iteration, len(keys), "?" if wanted is None else wanted,
                sorted(gathered.lost) or "none known", len(halves.inputs), len(halves.grads), len(halves.complete()),
                len(keys), unanswered or "none")
