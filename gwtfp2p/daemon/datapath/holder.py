"""A data holder's data path and iteration role: its microbatches out through the head, back through the
tail and the head.

Iteration t: take the F_d microbatches of (seed, shard, t), embed each (head) and hand it to the
outbox along one of this holder's complete flow units (round-robin when there are fewer units than
F_d); the last relay sends the activations back, the tail (the common receive side, ``receiver``)
computes the loss and its gradient goes back the same path; the head's backward closes the
microbatch. A live data holder loses no microbatch: the iteration is over only when every one of them
is back (``IterationLedger``); crash recovery resends a kept output whose hop is lost (``recovery``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.aggregation import losstags
from gwtfp2p.daemon.aggregation.rounds import Gathered, Outcome
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.config import DataConfig
from gwtfp2p.daemon.datapath.clipping import GlobalClip
from gwtfp2p.daemon.datapath.crosscheck import CrossCheck
from gwtfp2p.daemon.datapath.iterations import Closing
from gwtfp2p.daemon.datapath.ledger import IterationLedger, assign_units
from gwtfp2p.daemon.datapath.outbox import Outbox
from gwtfp2p.daemon.datapath.pace import Pace
from gwtfp2p.daemon.datapath.receiver import NEW, HopReceiver, HopRecord, HopTable
from gwtfp2p.daemon.datapath.recovery import Recovery
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.swarm.links import Ema
from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.testing import crashpoints
from gwtfp2p.daemon.wire import Closed
from gwtfp2p.model.head_tail import DataHolderExecutor
from gwtfp2p.transport import Ack, MicrobatchId, TransferMeta

if TYPE_CHECKING:  # imports ``datasets``: relays never pay for it
    from gwtfp2p.model.data import MicrobatchSampler

logger = logging.getLogger(__name__)
CLOSED_LOSS_LIMIT = 1e6  # wire.Closed.loss's range


class HolderPath:
    """The head and tail of one data holder, one iteration at a time (``begin`` starts one)."""

    def __init__(self, self_id: str, executor: DataHolderExecutor, sampler: MicrobatchSampler, *, tails: HopTable,
                 receiver: HopReceiver, outbox: Outbox, recovery: Recovery, compute: ComputeThread,
                 events: Events, compute_s: Ema, checker: CrossCheck | None = None) -> None:
        self.self_id = self_id
        self.checker = checker  # samples microbatches whose stage-1 output two replicas must agree on
        self.executor = executor
        self.sampler = sampler
        self.tails = tails  # this iteration's microbatches seen by the tail
        self.receiver = receiver
        self.outbox = outbox
        self.recovery = recovery
        self.compute = compute
        self.events = events
        self.ledger = IterationLedger(-1, 0)
        self.all_back = asyncio.Event()
        self.compute_s = compute_s  # head + tail seconds per microbatch (the node's measured compute)
        self.first_microbatch_at: float | None = None
        self.background = Background("data holder")
        self._heads: set[str] = set()  # ... and by the head's backward
        self._mb_seconds: dict[int, float] = {}

    def begin(self, iteration: int, n_microbatches: int) -> None:
        """Start iteration ``iteration``: a fresh ledger; the previous one's records are forgotten."""
        self.ledger, self.all_back = IterationLedger(iteration, n_microbatches), asyncio.Event()
        self.tails.drop_through(iteration - 1)  # the gradients sent in the last iteration stay for a redo ...
        self.outbox.drop_through(iteration - 1)  # ... and its outputs (``redo``)
        self._heads, self._mb_seconds = set(), {}

    async def send_microbatch(self, t: int, index: int, hop: Hop) -> asyncio.Task:
        """Embed microbatch ``index`` of iteration ``t`` and hand it to the outbox (a task: sent and kept)."""
        mb = MicrobatchId(data_holder=self.self_id, iteration=t, index=index)

        def head() -> torch.Tensor:
            return self.executor.head_forward(mb.key, self.sampler.microbatch(t, index)).cpu()

        hidden, seconds = await self.compute.timed(head)
        self._mb_seconds[index] = seconds
        self.ledger.sent(index, hop.unit, hop.peer)
        meta = TransferMeta(microbatch=mb, stage=1, flow_unit=hop.unit, path=(self.self_id,))
        if self.first_microbatch_at is None:
            self.first_microbatch_at = time.time()
            self.events.emit("first_microbatch", iteration=t, peer=hop.peer)
        if self.checker is not None:
            self.checker.maybe_check(meta, hidden, hop.peer)
        return self.background.spawn(self.outbox.send(meta, hidden, hop), f"forward {mb.key}")

    # -- tail and head (handlers answer at once, the work is queued) ------------------------------
    def _own_current(self, meta: TransferMeta) -> str:
        mb = meta.microbatch
        if mb.data_holder != self.self_id or meta.stage != 0:
            return "not a microbatch of this data holder"
        if mb.iteration != self.ledger.iteration or mb.index not in self.ledger.states:
            return f"microbatch {mb.key} is not part of the current iteration"
        return ""

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        reason = self._own_current(meta)
        if reason:
            return Ack(accepted=False, reason=reason)
        record, got = self.receiver.receive(sender, meta)
        if got != NEW:
            return Ack(duplicate=True)
        key = meta.microbatch.key
        self.background.spawn(self._tail(key, record, tensor), f"tail {key}")
        return Ack()

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        reason = self._own_current(meta)
        if reason:
            return Ack(accepted=False, reason=reason)
        key = meta.microbatch.key
        if key in self._heads:
            return Ack(duplicate=True)
        self._heads.add(key)
        self.outbox.backward_arrived(key, meta, sender)
        self.background.spawn(self._head(meta, tensor), f"head {key}")
        return Ack()

    async def _tail(self, key: str, record: HopRecord, tensor: torch.Tensor) -> None:
        index = record.meta.microbatch.index
        ledger = self.ledger
        (loss, grad), seconds = await self.compute.timed(
            lambda: (lambda lg: (lg[0], lg[1].cpu()))(self.executor.tail_backward(key, tensor)))
        self._mb_seconds[index] = self._mb_seconds.get(index, 0.0) + seconds
        ledger.tail_done(index, loss)  # once per microbatch and iteration, whatever comes again
        await self.receiver.gradient_ready(key, record, grad)

    async def _head(self, meta: TransferMeta, tensor: torch.Tensor) -> None:
        key, index = meta.microbatch.key, meta.microbatch.index
        _, seconds = await self.compute.timed(self.executor.head_backward, key, tensor)
        self.compute_s.add(self._mb_seconds.get(index, 0.0) + seconds)
        ledger = self.ledger
        if ledger.iteration == meta.microbatch.iteration and ledger.head_done(index) and ledger.closed:
            self.all_back.set()

    def last_iteration(self, last: int) -> int:
        """The latest iteration this data holder has microbatches of, at least ``last``."""
        return max(last, self.ledger.iteration)

    def refuse_after(self, _iteration: int) -> None:
        """A leaving data holder starts no new iteration; what arrives for the current one is taken."""

    def peer_dead(self, peer: str) -> None:
        """The failure detector found ``peer`` dead: resend what it took from us."""
        self.background.spawn(self.recovery.peer_dead(peer), f"peer {peer} dead")

    async def close(self) -> None:
        await self.background.close()


class HolderRole:
    """A data holder's ``IterationRole``: send its microbatches over its units, wait for all, report."""

    def __init__(self, path: HolderPath, *, spec: RunSpec, routing: FirstHops, recovery: Recovery,
                 closing: Closing, clip: GlobalClip | None, online_nodes: Callable[[], int], data: DataConfig,
                 events: Events, report_every_s: float) -> None:
        self.path = path
        self.clip = clip  # None: the run clips each part by its own norm
        self.spec = spec
        self.routing = routing
        self.recovery = recovery
        self.closing = closing
        self.online_nodes = online_nodes  # online nodes of the run, this one included
        self.data = data
        self.events = events
        self.report_every_s = report_every_s
        self.started = False  # the first iteration waits for ``min_nodes`` online nodes
        self._began_at = 0.0
        self._units = 0
        self._resends_before = 0
        self._pace = Pace()
        self._report: tuple[Closed, int, float, float, float | None] = (
            Closed(iteration=0, data_holders=()), 0, 0.0, 0.0, None)

    async def until_over(self, t: int, stop: asyncio.Event, abort: asyncio.Event) -> dict[str, Any] | None:
        if stop.is_set():
            return None
        if self.data.max_iterations and t >= self.data.max_iterations:
            self.events.emit("training_done", iteration=t)
            return None
        hops = await self._wait_for_units(t, stop)
        if hops is None:
            return None
        self._began_at, self._units = time.monotonic(), len({h.unit for h in hops})
        n = self.spec.microbatches_per_dh
        self.path.begin(t, n)
        self._resends_before = self.recovery.resends
        sends = [await self.path.send_microbatch(t, index, hop) for index, hop in enumerate(assign_units(hops, n))]
        if crashpoints.armed("exit_after_sending"):  # test tooling: crash once the first hops took them all
            await asyncio.gather(*sends, return_exceptions=True)
            crashpoints.hit("exit_after_sending", 0, t, self.events)
        while not await _first_set(self.path.all_back, abort, self.report_every_s * 6):
            if abort.is_set():
                return None
            self.events.emit("waiting", reason=f"iteration {t}: {n - self.path.ledger.done} of {n} microbatches "
                             "not back yet", iteration=t)
        ledger = self.path.ledger
        tokens = ledger.n_microbatches * self.spec.microbatch_size * self.spec.seq_len
        return {**losstags.encode(ledger.loss_sum()), "tokens": tokens}

    async def _wait_for_units(self, t: int, stop: asyncio.Event) -> list[Hop] | None:
        reported = 0.0
        while not stop.is_set():
            hops = self.routing.first_hops()
            online = self.online_nodes()
            if hops and (self.started or online >= self.data.min_nodes):
                self.started = True
                return hops
            if time.monotonic() - reported > self.report_every_s:
                reason = (f"{online} of {self.data.min_nodes} nodes online" if hops else
                          "no complete route through every stage yet")
                self.events.emit("waiting", reason=reason, iteration=t)
                reported = time.monotonic()
            await _first_set(stop, stop, self.routing.tick_s)
        return None

    def end_iteration(self, t: int) -> None:
        """Nothing to forget: the next iteration starts with a fresh ledger."""

    async def clip_norm(self, t: int, gathered: Gathered) -> float | None:
        """Tell every relay that ``t`` is over (with the swarm's loss); with global clipping, collect every
        stage's squared norm, add ours and tell them the total."""
        now = time.monotonic()
        seconds = now - self._began_at
        tokens = sum(int(tags.get("tokens", 0)) for tags in gathered.tags.values())
        period_s, tokens_per_s = self._pace.close(now, self._began_at, tokens)
        losses = losstags.swarm_loss(gathered.tags.values())  # exact: the same bits in any order
        closed = Closed(iteration=t, data_holders=gathered.members, loss=_wire_loss(losses.mean),
                        microbatches=losses.count, tokens_per_s=tokens_per_s)
        self._report = (closed, tokens, seconds, period_s, losses.mean)
        await self.closing.broadcast(closed)
        if self.clip is None:
            return None
        return await self.clip.total(t, gathered.sq_norm, lambda stages: self.closing.broadcast(closed, stages))

    async def stepped(self, t: int, outcome: Outcome) -> None:
        closed, tokens, seconds, period_s, loss = self._report
        ledger = self.path.ledger
        own = {f"{self.path.self_id}/{t}/{i}": value for i, value in ledger.losses().items()}
        done = ledger.done
        self.events.emit("iteration", iteration=t, loss=loss, losses=own, data_holders=list(outcome.members),
                         microbatches=done, lost_microbatches=ledger.n_microbatches - done,
                         swarm_microbatches=closed.microbatches, tokens=tokens, seconds=seconds, period_s=period_s,
                         resent_microbatches=self.recovery.resends - self._resends_before,
                         tokens_per_s=closed.tokens_per_s, units=self._units, hash=outcome.step.state_hash,
                         count=outcome.step.count, clip_scale=outcome.step.clip_scale)


def _wire_loss(mean: float | None) -> float | None:
    """The swarm's mean loss as ``Closed`` carries it: None when there is none or it is not finite (a
    diverged training; the data holders' own ``iteration`` events still show it)."""
    return mean if mean is not None and math.isfinite(mean) and abs(mean) <= CLOSED_LOSS_LIMIT else None


class FirstHops(Protocol):
    tick_s: float

    def first_hops(self) -> list[Hop]: ...


async def _first_set(event: asyncio.Event, stop: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` or ``stop`` is set, at most ``timeout_s``; whether ``event`` is set."""
    waits = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())}
    _, pending = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return event.is_set()
