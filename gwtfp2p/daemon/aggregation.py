"""Replica aggregation: every live member of a part gathers all members' (gradient sum, count).

Our own all-gather over the transport (hivemind's averager cannot guarantee per-iteration
bit-identical replicas, see HIVEMIND_NOTES.md): each member pushes its contribution for
iteration t to every member it expects, tagged with the list it expects (``meta.path``); a
receiver adds any member it did not know and answers late-comers with its own contribution.
When every expected contribution is there, each member reduces them sorted by peer id and takes
the same AdamW step (``Trainable.apply_step``), so replicas stay bit-identical. Cost per member
and step: (R−1) sends and receives of the part's gradient (R = replicas), no leader.
Contributions ride the forward RPC tagged ``kind=grad`` (the transport's generic tensor path).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.members import MemberTable
from gwtfp2p.daemon.sending import Sender
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.model.trainable import StepResult, Trainable
from gwtfp2p.transport import Ack, MicrobatchId, TransferMeta

logger = logging.getLogger(__name__)
GRAD_KIND = "grad"
MAX_MEMBERS_LISTED = 64


@dataclass
class Received:
    contribution: GradContribution
    tags: dict[str, Any]


@dataclass
class Round:
    """Contributions of one iteration, and to whom ours went."""

    received: dict[str, Received] = field(default_factory=dict)
    own: Received | None = None
    pushed: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Outcome:
    step: StepResult
    members: tuple[str, ...]
    tags: dict[str, dict[str, Any]]  # every member's tags (losses, tokens), ours included


class Aggregator:
    """The all-gather and step of one part (stage ``stage``; 0 for the data holders)."""

    def __init__(self, self_id: str, stage: int, members: MemberTable, part: Trainable,
                 compute: ComputeThread, sender: Sender, timeout_s: float = 60.0) -> None:
        self.self_id = self_id
        self.stage = stage
        self.members = members
        self.part = part
        self.compute = compute
        self.sender = sender
        self.timeout_s = timeout_s
        self.done_through = members.own.from_iteration - 1  # last iteration aggregated here
        self.active: int | None = None  # iteration being aggregated now
        self.last_hash = ""
        self.state_iteration = members.own.from_iteration  # steps in the part's state (compute thread)
        self._rounds: dict[int, Round] = {}
        self._changed = asyncio.Condition()
        self.background = Background(f"aggregation of stage {stage}")
        # Online same-part peers that have not told us their membership yet: waited for (their
        # notice comes when they discover us), except those that stayed silent past a deadline.
        self.online_peers: Callable[[], list[str]] = lambda: []
        self.ignored: set[str] = set()

    def _round(self, iteration: int) -> Round:
        return self._rounds.setdefault(iteration, Round())

    # -- receiving ------------------------------------------------------------------------------
    async def on_contribution(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        t = meta.microbatch.iteration
        count = meta.tags.get("count")
        if meta.stage != self.stage or not isinstance(count, int) or count < 0:
            return Ack(accepted=False, reason="not a contribution for this part")
        if t <= self.done_through and t not in self._rounds:
            return Ack(accepted=False, reason=f"iteration {t} already aggregated here")
        rnd = self._round(t)
        if sender in rnd.received:
            return Ack(duplicate=True)
        rnd.received[sender] = Received(GradContribution(sender, tensor.reshape(-1), count), dict(meta.tags))
        for peer in (sender, *meta.path):
            if peer not in self.members:
                self.members.add(peer, t)
                logger.info("stage %d: %s aggregates with us from iteration %d", self.stage, peer, t)
        if rnd.own is not None and sender not in rnd.pushed:
            self._push(t, sender)  # a late-comer still needs ours
        async with self._changed:
            self._changed.notify_all()
        return Ack()

    def seen_iteration(self, iteration: int) -> bool:
        """Whether a member already sent its contribution for ``iteration`` (it is closed)."""
        rnd = self._rounds.get(iteration)
        return rnd is not None and bool(rnd.received)

    # -- sending --------------------------------------------------------------------------------
    def _push(self, iteration: int, peer: str) -> None:
        rnd = self._round(iteration)
        if rnd.own is None or peer == self.self_id:
            return
        rnd.pushed.add(peer)
        expected = tuple(self.members.expected(iteration))[:MAX_MEMBERS_LISTED]
        meta = TransferMeta(microbatch=MicrobatchId(data_holder=self.self_id, iteration=iteration, index=0),
                            stage=self.stage, path=expected,
                            tags={"kind": GRAD_KIND, "count": rnd.own.contribution.count, **rnd.own.tags})
        self.background.spawn(self.sender.send("forward", peer, meta, rnd.own.contribution.grad_sum),
                              f"contribution {iteration} to {peer}")

    # -- the step -------------------------------------------------------------------------------
    async def aggregate(self, iteration: int, tags: dict[str, Any] | None = None) -> Outcome:
        """Gather every expected member's contribution for ``iteration``, reduce, step."""
        self.active = iteration
        rnd = self._round(iteration)
        own = await self.compute.run(self._own_contribution)
        rnd.own = Received(own, dict(tags or {}))
        expected = await self._gather(iteration, rnd)
        contributions = [rnd.own.contribution if p == self.self_id else rnd.received[p].contribution
                         for p in expected]
        step = await self.compute.run(self._apply, contributions, iteration)
        every = {p: (rnd.own.tags if p == self.self_id else rnd.received[p].tags) for p in expected}
        self.done_through, self.active, self.last_hash = iteration, None, step.state_hash
        for old in [t for t in self._rounds if t < iteration - 1]:
            del self._rounds[old]  # ours of the last round stays, for members who learn of us late
        return Outcome(step, tuple(expected), every)

    def _own_contribution(self) -> GradContribution:
        """On the compute thread: ours, on the CPU (the transport sends CPU tensors; every member then
        reduces CPU tensors alike, whatever its device)."""
        own = self.part.grad_contribution(self.self_id)
        return GradContribution(own.replica_id, own.grad_sum.cpu(), own.count)

    def _apply(self, contributions: list[GradContribution], iteration: int) -> StepResult:
        """On the compute thread: the step, and the state's iteration with it (read by ``state``)."""
        step = self.part.apply_step(contributions)
        self.state_iteration = iteration + 1
        return step

    def state(self) -> tuple[int, bytes]:
        """On the compute thread: (iteration, state bytes), consistent with each other."""
        return self.state_iteration, self.part.state_bytes()

    def unannounced(self) -> list[str]:
        return [p for p in self.online_peers() if p not in self.members and p not in self.ignored]

    async def _gather(self, iteration: int, rnd: Round) -> list[str]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while True:
            expected = self.members.expected(iteration)
            for peer in expected:
                if peer != self.self_id and peer not in rnd.pushed:
                    self._push(iteration, peer)
            missing = [p for p in expected if p != self.self_id and p not in rnd.received]
            unannounced = [p for p in self.unannounced() if p not in self.members]
            if not missing and not unannounced:
                return expected
            remaining = deadline - loop.time()
            if remaining <= 0:
                logger.warning("stage %d iteration %d: no contribution from %s within %.0f s; going on "
                               "without them", self.stage, iteration, missing, self.timeout_s)
                for peer in missing:
                    self.members.remove(peer)
                self.ignored.update(unannounced)
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                async with self._changed:
                    await asyncio.wait_for(self._changed.wait(), min(remaining, 1.0))

    async def close(self) -> None:
        await self.background.close()
