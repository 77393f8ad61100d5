"""Lost work whose other half died too: neighbouring replicas dead in one iteration (``LostWork``'s second phase).

When the replica of stage s that did microbatch m and the one of stage s+1 it sent m on to both die before
their stages aggregate, no live neighbour holds the missing half of either's work: stage s's survivors get
m's input (from below) and no gradient, stage s+1's the gradient (from above) and no input. The survivors
rebuild the halves as the dead pair made them: a stage-s survivor recomputes m's output
(``StageExecutor.recompute``, bitwise) and pushes it up to every live replica of stage s+1, which redoes m
and pushes its input gradient back down. A longer chain works alike (an input pushed up without a gradient
is recomputed and pushed on). Tensors travel tagged ``chain``, only between relays of neighbouring stages,
for the iteration this part aggregates, at most as many as the iteration has microbatches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.transport import Ack, MicrobatchId, TransferMeta

logger = logging.getLogger(__name__)
CHAIN_TAG = "chain"  # on a redo tensor a survivor of the neighbouring stage rebuilt (not a kept one)
REDO_TAG = "redo"  # on a forward (an input) or backward (a gradient): the replica whose work it was
Item = tuple[str, torch.Tensor, torch.Tensor]  # (microbatch key, the stage's input, its output's gradient)
MAX_HALVES = 4096  # halves buffered per iteration when the iteration's microbatch count is not known


class Recomputing(Protocol):
    def recompute(self, mb_id: str, hidden: torch.Tensor) -> torch.Tensor: ...


class Redoable(Recomputing, Protocol):
    """A stage's executor as the redo uses it (``StageExecutor``): ``items`` are (microbatch key, the stage's
    input, its output's gradient)."""

    def redo(self, origin: str, items: list[Item]) -> tuple[GradContribution, dict[str, torch.Tensor]]: ...


class TensorSender(Protocol):
    async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack | None: ...


@dataclass
class Halves:
    """What a survivor holds of one iteration's lost work, by microbatch key: the stage's inputs, its outputs'
    gradients, whose work each was, the ids, and the keys whose input a neighbouring survivor rebuilt."""

    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    whose: dict[str, str] = field(default_factory=dict)
    ids: dict[str, MicrobatchId] = field(default_factory=dict)
    chained: set[str] = field(default_factory=set)  # input rebuilt below (its input gradient goes back down)
    rebuilt: set[str] = field(default_factory=set)  # either half rebuilt
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, kind: str, meta: TransferMeta, tensor: torch.Tensor, whose: str) -> None:
        key = meta.microbatch.key
        (self.inputs if kind == "forward" else self.grads).setdefault(key, tensor)
        if whose:
            self.whose.setdefault(key, whose)
        self.ids.setdefault(key, meta.microbatch)
        self.changed.set()

    def complete(self) -> list[str]:
        return sorted(self.inputs.keys() & self.grads.keys())

    def __len__(self) -> int:
        return len(self.inputs) + len(self.grads)


class Chain:
    """One relay's chained redo: accepting rebuilt halves from the neighbouring stages' survivors (buffered from
    before this node asks: they may come first), pushing rebuilt outputs up and input gradients down."""

    def __init__(self, self_id: str, stage: int, n_stages: int, *, executor: Recomputing, sender: TensorSender,
                 view: SwarmView, is_dead: Callable[[str], bool], compute: ComputeThread,
                 aggregating: Callable[[], int], swarm_microbatches: Callable[[int], int | None],
                 clock: Callable[[], float],
                 ask_down: Callable[[int, tuple[MicrobatchId, ...]], Awaitable[None]] | None = None) -> None:
        self.self_id, self.stage, self.n_stages = self_id, stage, n_stages
        self.executor, self.sender, self.view, self.is_dead = executor, sender, view, is_dead
        self.compute, self.aggregating, self.swarm_microbatches = compute, aggregating, swarm_microbatches
        self.clock, self.ask_down = clock, ask_down  # ask_down(t, ids): the stage below, to rebuild these inputs
        self.on_input: Callable[[int], None] = lambda _t: None  # a rebuilt input of ``t`` came (``redo_serve``)
        self._came: dict[int, Halves] = {}  # rebuilt halves by iteration, until that iteration's redo takes them
        self._pushed: dict[int, set[str]] = {}  # keys whose output we rebuilt and pushed up, by iteration

    def on_tensor(self, sender: str, kind: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        """A rebuilt input (``forward``, from stage - 1) or input gradient (``backward``, from stage + 1)."""
        record = self.view.seen.get(sender)  # a record lapsed under load still names the sender's stage
        from_stage = self.stage - 1 if kind == "forward" else self.stage + 1
        if record is None or record.role != "relay" or record.stage != from_stage or self.is_dead(sender):
            return Ack(accepted=False, reason=f"a chained redo {kind} comes from a replica of stage {from_stage}")
        t, now = meta.microbatch.iteration, self.aggregating()
        if meta.stage != self.stage or not now <= t <= now + 1:
            return Ack(accepted=False, reason=f"no chained redo of stage {meta.stage} iteration {t} here")
        for old in [i for i in self._came if i < now]:
            del self._came[old]
        came = self._came.setdefault(t, Halves())
        if len(came) >= 2 * (self.swarm_microbatches(t) or MAX_HALVES):
            return Ack(accepted=False, reason=f"more chained redo tensors than iteration {t} has microbatches")
        came.add(kind, meta, tensor, "")
        if kind == "forward":
            self.on_input(t)
        return Ack()

    async def fill(self, t: int, halves: Halves, wanted: int | None, deadline: float) -> None:
        """Complete ``halves`` with rebuilt ones until ``wanted`` microbatches have both (None: until none lacks
        one) or ``deadline``, pushing each input that has no gradient up (recomputed) as it comes."""
        came = self._came.setdefault(t, Halves())
        pushed, asked = self._pushed.setdefault(t, set()), set()
        while True:
            came.changed.clear()
            _merge(came, halves)
            lacking = halves.inputs.keys() ^ halves.grads.keys()
            up = sorted(k for k in lacking - pushed if k in halves.inputs) if self.stage < self.n_stages else []
            if up:
                await self.push_up(t, halves, up)
            down = sorted(k for k in lacking - asked if k in halves.grads) if self.stage > 1 else []
            if down and self.ask_down is not None:  # their replica below sent its sum: its stage does not redo
                asked.update(down)
                await self.ask_down(t, tuple(halves.ids[k] for k in down))
            done = len(halves.complete())
            if (done >= wanted if wanted is not None else not lacking) or self.clock() >= deadline:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(came.changed.wait(), deadline - self.clock())

    async def push_up(self, t: int, halves: Halves, keys: list[str]) -> None:
        """The outputs of ``keys`` recomputed from their inputs in ``halves``, to stage + 1's replicas."""
        self._pushed.setdefault(t, set()).update(keys)
        self._pushed = {i: k for i, k in self._pushed.items() if i >= t - 1}
        executor, inputs = self.executor, halves.inputs
        outputs = await self.compute.run(lambda: [executor.recompute(k, inputs[k]) for k in keys])
        await self._send("forward", self.stage + 1, halves, dict(zip(keys, outputs, strict=True)))
        logger.info("stage %d iteration %d: %d lost outputs rebuilt for stage %d", self.stage, t, len(keys),
                    self.stage + 1)

    async def push_down(self, halves: Halves, grads_in: dict[str, torch.Tensor]) -> None:
        """The input gradients of the microbatches whose input was rebuilt below, to stage - 1's replicas."""
        chained = {k: grads_in[k] for k in sorted(halves.chained) if k in grads_in}
        if chained and self.stage > 1:
            await self._send("backward", self.stage - 1, halves, chained)

    async def _send(self, kind: str, stage: int, halves: Halves, tensors: dict[str, torch.Tensor]) -> None:
        peers = sorted(r.peer_id for r in self.view.by_stage(stage)  # a joiner's record may still say joining
                       if r.role == "relay" and not self.is_dead(r.peer_id) and r.peer_id != self.self_id)
        metas = {k: TransferMeta(microbatch=halves.ids[k], stage=stage,
                                 tags={REDO_TAG: halves.whose.get(k, ""), CHAIN_TAG: True}) for k in tensors}
        acks = await asyncio.gather(*(self.sender.send(kind, peer, metas[k], tensor)
                                      for peer in peers for k, tensor in tensors.items()))
        refused = sum(1 for ack in acks if ack is None or not ack.accepted)
        if refused:
            logger.info("%d of %d chained redo %ss to stage %d not taken", refused, len(acks), kind, stage)

    def came_for(self, t: int) -> bool:
        """Whether a rebuilt half of ``t`` came already (this replica is inside a longer chain)."""
        return bool(self._came.get(t))

    def pushed(self, t: int) -> set[str]:
        """The keys of ``t`` whose output we rebuilt and pushed up."""
        return set(self._pushed.get(t, ()))

    def came(self, t: int) -> Halves:
        """The rebuilt halves of ``t`` that came (empty if none)."""
        return self._came.get(t) or Halves()

    def forget(self, t: int) -> None:
        self._came.pop(t, None)


def _merge(came: Halves, halves: Halves) -> None:
    """Rebuilt halves into ``halves`` (a key's own half, from a live neighbour, stays first)."""
    for key, x in came.inputs.items():
        if key not in halves.inputs:
            halves.inputs[key], halves.ids[key] = x, came.ids[key]
            halves.chained.add(key)
            halves.rebuilt.add(key)
    for key, g in came.grads.items():
        if key not in halves.grads:
            halves.grads[key] = g
            halves.ids.setdefault(key, came.ids[key])
            halves.rebuilt.add(key)
