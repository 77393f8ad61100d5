"""A data holder's iteration driver: microbatches out over its flow units, losses, closing.

Iteration t: take the F_d microbatches of (seed, shard, t), embed each (head) and send it along
one of this holder's complete flow units (round-robin when there are fewer units than F_d; wait
while there are none); the last relay sends the activations back, the tail computes the loss and
its gradient goes back the same path; the head's backward closes the microbatch. When all are
closed, the data holders aggregate head+tail together, and every relay is told the iteration is
closed (``Closed``, carrying the swarm's loss). Then t+1.

Crash recovery: each embedded microbatch is kept (``Upstream``) until its gradient is back and
resent to another first hop if that one is lost; as the tail, a duplicate forward from a sender
replacing a lost hop gets the cached gradient (the loss is recorded once), and a gradient that
cannot reach the last relay is reported upstream (``Lost``). A live data holder loses no
microbatch: the iteration closes only when every one of them is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon import crashpoints
from gwtfp2p.daemon.aggregation import Aggregator, Outcome
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.control import Closed
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.gate import IterationGate
from gwtfp2p.daemon.iteration import IterationLedger, assign_units
from gwtfp2p.daemon.links import Ema
from gwtfp2p.daemon.recovery import Network, Upstream, report_lost
from gwtfp2p.daemon.recovery_wire import RecoveryMessage
from gwtfp2p.daemon.routing import FlowDriver, Hop
from gwtfp2p.daemon.sending import Sender
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.model.head_tail import DataHolderExecutor
from gwtfp2p.transport import Ack, MicrobatchId, TransferMeta

if TYPE_CHECKING:
    from gwtfp2p.daemon.peers import PeerManager
    from gwtfp2p.model.data import MicrobatchSampler

logger = logging.getLogger(__name__)
WAITING_REPORT_S = 5.0


class DataHolder:
    """Drives iterations of one data holder and serves its head and tail."""

    def __init__(self, self_id: str, spec: RunSpec, executor: DataHolderExecutor, sampler: MicrobatchSampler,
                 compute: ComputeThread, sender: Sender, routing: FlowDriver, gate: IterationGate,
                 aggregator: Aggregator, events: Events, on_closed: Callable[[Closed], Awaitable[None]]) -> None:
        self.self_id = self_id
        self.spec = spec
        self.executor = executor
        self.sampler = sampler
        self.compute = compute
        self.sender = sender
        self.routing = routing
        self.gate = gate
        self.aggregator = aggregator
        self.events = events
        self.on_closed = on_closed
        self.ledger: IterationLedger | None = None
        self._closed = asyncio.Event()
        self._tails: dict[str, _Tail] = {}  # this iteration's microbatches seen by the tail
        self._heads: set[str] = set()  # ... and by the head's backward
        self.compute_s = Ema(0.2)
        self._mb_seconds: dict[int, float] = {}
        self.background = Background("data holder")
        self.loss: float | None = None
        self.tokens_per_s = 0.0
        self.first_microbatch_at: float | None = None
        self.min_nodes = 0
        self.online_nodes: Callable[[], int] = lambda: 0
        self.started = False  # the first iteration waits for ``min_nodes`` online nodes
        self.upstream = Upstream(self_id, 0, spec.n_stages, sender, lambda _meta, tried: routing.other_first_hop(tried))
        self.upstream.held_here = self._held_here
        self.upstream.events = events
        self.network: Network | None = None

    def attach(self, peers: PeerManager, events: Events) -> None:
        """Wire recovery to the node's peer management (liveness, queries)."""
        self.network = self.upstream.network = peers
        self.sender.on_failure = peers.suspect
        peers.on_dead.append(self.peer_dead)
        self.background.spawn(self.upstream.run(asyncio.Event()), "recovery deadlines")  # until close

    def peer_dead(self, peer: str) -> None:
        self.background.spawn(self.upstream.peer_dead(peer), f"peer {peer} dead")

    async def on_recovery(self, sender: str, message: RecoveryMessage) -> None:
        await self.upstream.on_message(sender, message)

    def _held_here(self, lost: str, mbs: tuple[MicrobatchId, ...]) -> list[MicrobatchId]:
        return [mb for mb in mbs if (tail := self._tails.get(mb.key)) is not None and lost in tail.meta.path]

    # -- the iteration loop ---------------------------------------------------------------------
    async def run(self, stop: asyncio.Event, abort: asyncio.Event, max_iterations: int = 0) -> None:
        """Iterate until ``stop`` (no new iteration) or ``abort`` (drop the current one)."""
        while not stop.is_set() and (max_iterations == 0 or self.gate.iteration < max_iterations):
            if not await self._iteration(self.gate.iteration, stop, abort):
                return
        if not stop.is_set():
            self.events.emit("training_done", iteration=self.gate.iteration)

    async def _iteration(self, t: int, stop: asyncio.Event, abort: asyncio.Event) -> bool:
        hops = await self._wait_for_units(stop)
        if hops is None:
            return False
        started = time.monotonic()
        n = self.spec.microbatches_per_dh
        self.ledger, self._closed = IterationLedger(t, n), asyncio.Event()
        self._tails, self._heads, self._mb_seconds = {}, set(), {}
        resends_before = self.upstream.resends
        sends = [await self._send_microbatch(t, index, hop) for index, hop in enumerate(assign_units(hops, n))]
        if crashpoints.armed("exit_after_sending"):  # test tooling: crash once the first hops took them all
            await asyncio.gather(*sends, return_exceptions=True)
            crashpoints.hit("exit_after_sending", 0, t, self.events)
        while not await self._wait(self._closed, abort, WAITING_REPORT_S * 6):
            if abort.is_set():
                return False
            self.events.emit("waiting", reason=f"iteration {t}: {n - self.ledger.done} of {n} microbatches "
                             "not back yet", iteration=t)
        outcome = await self._aggregate(t)
        resends = self.upstream.resends - resends_before
        await self._finish(t, outcome, time.monotonic() - started, len({h.unit for h in hops}), resends)
        return True

    async def _wait_for_units(self, stop: asyncio.Event) -> list[Hop] | None:
        reported = 0.0
        while not stop.is_set():
            hops = self.routing.first_hops()
            online = self.online_nodes()
            if hops and (self.started or online >= self.min_nodes):
                self.started = True
                return hops
            if time.monotonic() - reported > WAITING_REPORT_S:
                reason = (f"{online} of {self.min_nodes} nodes online" if hops else
                          "no complete route through every stage yet")
                self.events.emit("waiting", reason=reason, iteration=self.gate.iteration)
                reported = time.monotonic()
            await self._wait(stop, stop, self.routing.tick_s)
        return None

    @staticmethod
    async def _wait(event: asyncio.Event, stop: asyncio.Event, timeout_s: float) -> bool:
        waits = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())}
        _, pending = await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return event.is_set()

    async def _send_microbatch(self, t: int, index: int, hop: Hop) -> asyncio.Task:
        mb = MicrobatchId(data_holder=self.self_id, iteration=t, index=index)

        def head() -> torch.Tensor:
            return self.executor.head_forward(mb.key, self.sampler.microbatch(t, index)).cpu()

        hidden, seconds = await self.compute.timed(head)
        self._mb_seconds[index] = seconds
        assert self.ledger is not None
        self.ledger.sent(index, hop.unit, hop.peer)
        meta = TransferMeta(microbatch=mb, stage=1, flow_unit=hop.unit, path=(self.self_id,))
        if self.first_microbatch_at is None:
            self.first_microbatch_at = time.time()
            self.events.emit("first_microbatch", iteration=t, peer=hop.peer)
        return self.background.spawn(self.upstream.send(meta, hidden, hop), f"forward {mb.key}")

    # -- tail and head (handlers answer at once, the work is queued) ------------------------------
    def _own_current(self, meta: TransferMeta) -> str:
        mb = meta.microbatch
        if mb.data_holder != self.self_id or meta.stage != 0:
            return "not a microbatch of this data holder"
        if self.ledger is None or mb.iteration != self.ledger.iteration or mb.index not in self.ledger.states:
            return f"microbatch {mb.key} is not part of the current iteration"
        return ""

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        reason = self._own_current(meta)
        if reason:
            return Ack(accepted=False, reason=reason)
        key = meta.microbatch.key
        tail = self._tails.get(key)
        if tail is not None:
            self._tail_duplicate(sender, meta, tail)
            return Ack(duplicate=True)
        self._tails[key] = _Tail(sender, meta)
        self.background.spawn(self._tail(key, tensor), f"tail {key}")
        return Ack()

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        reason = self._own_current(meta)
        if reason:
            return Ack(accepted=False, reason=reason)
        key = meta.microbatch.key
        if key in self._heads:
            return Ack(duplicate=True)
        self._heads.add(key)
        self.upstream.backward_arrived(key, meta)
        self.background.spawn(self._head(meta, tensor), f"head {key}")
        return Ack()

    async def _tail(self, key: str, tensor: torch.Tensor) -> None:
        tail = self._tails[key]
        index = tail.meta.microbatch.index
        (loss, grad), seconds = await self.compute.timed(
            lambda: (lambda lg: (lg[0], lg[1].cpu()))(self.executor.tail_backward(key, tensor)))
        self._mb_seconds[index] = self._mb_seconds.get(index, 0.0) + seconds
        assert self.ledger is not None
        self.ledger.tail_done(index, loss)  # once per microbatch and iteration, whatever comes again
        tail.grad = grad
        await self._send_tail_grad(key, tail)

    async def _send_tail_grad(self, key: str, tail: _Tail) -> None:
        prev = tail.prev
        back = TransferMeta(microbatch=tail.meta.microbatch, stage=self.spec.n_stages, flow_unit=tail.meta.flow_unit,
                            path=tail.meta.path, tags={"rc": 0})
        assert tail.grad is not None
        ack = await self.sender.send("backward", prev, back, tail.grad)
        if ack is not None and (ack.accepted or ack.duplicate):
            return
        if tail.prev == prev and self._tails.get(key) is tail:  # not re-pointed meanwhile
            await report_lost(self.network, self.upstream, tail.meta, prev, 0)

    def _tail_duplicate(self, sender: str, meta: TransferMeta, tail: _Tail) -> None:
        """A forward we already have: from a sender replacing a lost last hop, it gets our gradient."""
        if sender == tail.prev:
            return
        lost = meta.tags.get("lost")
        if isinstance(lost, str) and lost in tail.meta.path:
            self._tail_repoint(sender, meta, tail)
        elif self.network is not None:
            self.background.spawn(self._tail_repoint_if_dead(sender, meta, tail), f"check {tail.prev}")

    async def _tail_repoint_if_dead(self, sender: str, meta: TransferMeta, tail: _Tail) -> None:
        assert self.network is not None
        if self._tails.get(meta.microbatch.key) is tail and not await self.network.alive(tail.prev):
            self._tail_repoint(sender, meta, tail)

    def _tail_repoint(self, sender: str, meta: TransferMeta, tail: _Tail) -> None:
        key, lost = meta.microbatch.key, tail.prev
        tail.prev, tail.meta = sender, meta
        kind = "repoint"
        if tail.grad is not None:
            kind = "gradient_resend"
            self.background.spawn(self._send_tail_grad(key, tail), f"gradient {key}")
        logger.info("%s of %s: last hop %s replaced by %s", kind, key, lost, sender)
        self.events.emit("recovery", kind=kind, microbatch=key, stage=0, lost=lost, recomputed_hops=0, extra_s=0.0)

    async def _head(self, meta: TransferMeta, tensor: torch.Tensor) -> None:
        key, index = meta.microbatch.key, meta.microbatch.index
        _, seconds = await self.compute.timed(self.executor.head_backward, key, tensor)
        self.compute_s.add(self._mb_seconds.get(index, 0.0) + seconds)
        ledger = self.ledger
        if ledger is not None and ledger.iteration == meta.microbatch.iteration and ledger.head_done(index) \
                and ledger.closed:
            self._closed.set()

    # -- closing --------------------------------------------------------------------------------
    async def _aggregate(self, t: int) -> Outcome:
        assert self.ledger is not None
        tokens = self.ledger.n_microbatches * self.spec.microbatch_size * self.spec.seq_len
        tags = {"loss_sum": self.ledger.loss_sum(), "n_loss": len(self.ledger.losses()), "tokens": tokens}
        await self.gate.begin_step()
        try:
            return await self.aggregator.aggregate(t, tags)
        finally:
            await self.gate.advance(t + 1)

    async def _finish(self, t: int, outcome: Outcome, seconds: float, units: int, resends: int) -> None:
        assert self.ledger is not None
        loss_sum = sum(float(tags.get("loss_sum", 0.0)) for tags in outcome.tags.values())
        n_loss = sum(int(tags.get("n_loss", 0)) for tags in outcome.tags.values())
        tokens = sum(int(tags.get("tokens", 0)) for tags in outcome.tags.values())
        self.loss = loss_sum / n_loss if n_loss else None
        self.tokens_per_s = tokens / seconds if seconds > 0 else 0.0
        closed = Closed(iteration=t, data_holders=outcome.members, loss=self.loss, microbatches=n_loss,
                        tokens_per_s=self.tokens_per_s)
        await self.on_closed(closed)
        own = {f"{self.self_id}/{t}/{i}": loss for i, loss in self.ledger.losses().items()}
        done = self.ledger.done
        self.events.emit("iteration", iteration=t, loss=self.loss, losses=own, data_holders=list(outcome.members),
                         microbatches=done, lost_microbatches=self.ledger.n_microbatches - done,
                         swarm_microbatches=n_loss, resent_microbatches=resends, tokens=tokens, seconds=seconds,
                         tokens_per_s=self.tokens_per_s, units=units, hash=outcome.step.state_hash,
                         count=outcome.step.count)

    async def close(self) -> None:
        await self.background.close()
        await self.upstream.close()


@dataclass
class _Tail:
    """A microbatch the tail received: from whom (re-pointed when a lost hop is replaced), the
    metadata and, once computed, the gradient (sent again to a replacing sender)."""

    prev: str
    meta: TransferMeta
    grad: torch.Tensor | None = None
