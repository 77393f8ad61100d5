"""A relay's work on microbatches: forward and backward through its stage, and its iteration role.

Receivers acknowledge at once and queue the work (handlers must answer fast); the compute runs on the
one compute thread. A forward is recorded by the receive side (``receiver``), computed when this stage
reaches its iteration, and sent on through the outbox (``outbox``) along the unit it arrived on (or to
the holder a recovery names, or the cheapest next replica when the unit is gone). A backward computes
the gradient and the receive side sends it back. The microbatches of a data holder that died are
dropped. As an ``IterationRole``: an iteration is over when the data holders close it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch

from gwtfp2p.daemon.aggregation.rounds import Gathered, Outcome
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.datapath.clipping import GlobalClip
from gwtfp2p.daemon.datapath.gate import IterationGate
from gwtfp2p.daemon.datapath.iterations import Closing
from gwtfp2p.daemon.datapath.outbox import Outbox
from gwtfp2p.daemon.datapath.receiver import AGAIN, NEW, HopReceiver, HopRecord, HopTable
from gwtfp2p.daemon.datapath.recovery import Recovery
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.swarm.links import Ema
from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.testing import crashpoints
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.transport import Ack, TransferMeta

logger = logging.getLogger(__name__)


class NextHops(Protocol):
    """The routing as the data plane reads it (``swarm.routing.FlowDriver``)."""

    def next_hop(self, in_unit: str) -> Hop | None: ...
    def fallback_hop(self, exclude: set[str] | frozenset[str] = frozenset()) -> Hop | None: ...


def relay_other_hop(stage: int, n_stages: int, routing: NextHops,
                    is_dead: Callable[[str], bool]) -> Callable[[TransferMeta, set[str]], Hop | None]:
    """Another next hop for a forward its first choice did not take (or lost): the cheapest other replica
    of the next stage, or, from the last stage, the microbatch's data holder if it lives."""

    def other_hop(meta: TransferMeta, exclude: set[str]) -> Hop | None:
        if stage == n_stages:
            holder = meta.microbatch.data_holder
            return None if holder in exclude or is_dead(holder) else Hop(holder, "")
        return routing.fallback_hop(exclude)

    return other_hop


class RelayPath:
    """Forward/backward handling of stage ``stage`` on one relay."""

    def __init__(self, self_id: str, stage: int, n_stages: int, executor: StageExecutor, *, hops: HopTable,
                 receiver: HopReceiver, outbox: Outbox, recovery: Recovery, compute: ComputeThread,
                 routing: NextHops, gate: IterationGate, is_dead: Callable[[str], bool], events: Events,
                 compute_s: Ema, wait_for_step_s: float) -> None:
        self.self_id = self_id
        self.stage = stage
        self.n_stages = n_stages
        self.executor = executor
        self.hops = hops
        self.receiver = receiver
        self.outbox = outbox
        self.recovery = recovery
        self.compute = compute
        self.routing = routing
        self.gate = gate
        self.is_dead = is_dead
        self.events = events
        self.wait_for_step_s = wait_for_step_s
        self.compute_s = compute_s  # forward + backward seconds per microbatch (the node's measured compute)
        self.forwards = 0
        self.backwards = 0
        self.recomputes = 0
        self.background = Background("relay data path")
        self.accept_until: int | None = None  # set when leaving: later iterations are refused

    # -- handlers (answer at once) ----------------------------------------------------------------
    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        reason = self._refusal(meta)
        if reason:
            return Ack(accepted=False, reason=reason)
        record, got = self.receiver.receive(sender, meta)
        key = meta.microbatch.key
        if got == NEW:
            self.background.spawn(self._forward(key, record, tensor), f"forward {key}")
            return Ack()
        then = meta.tags.get(f"then.{self.outbox.next_stage}")
        if got == AGAIN and isinstance(then, str) and key in self.outbox:
            # resent to rejoin a holder we did not send it to: send ours there
            self.background.spawn(self.recovery.redirect(key, Hop(then, ""), meta.tags), f"redirect {key}")
        return Ack(duplicate=True)

    def _refusal(self, meta: TransferMeta) -> str:
        if meta.stage != self.stage:
            return f"this relay serves stage {self.stage}, not {meta.stage}"
        if self._over(meta.microbatch.iteration):
            return f"iteration {meta.microbatch.iteration} is over here"
        if self.accept_until is not None and meta.microbatch.iteration > self.accept_until:
            return "this relay is leaving"
        if self.is_dead(meta.microbatch.data_holder):
            return "its data holder is gone"
        return ""

    def _over(self, iteration: int) -> bool:
        """Whether this part has stepped past ``iteration`` (work of it is refused or dropped here)."""
        return iteration < self.gate.iteration

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        if crashpoints.armed_at("exit_before_backward", self.stage, meta.microbatch.iteration):
            await self._forwards_sent(meta.microbatch.iteration)  # tests only: the point is after the forwards
        crashpoints.hit("exit_before_backward", self.stage, meta.microbatch.iteration, self.events)
        key = meta.microbatch.key
        if self._over(meta.microbatch.iteration):  # this part re-synced past it meanwhile
            return Ack(accepted=False, reason=f"iteration {meta.microbatch.iteration} is over here")
        record = self.hops.get(key)
        if record is None or not (key in self.outbox or record.done):
            return Ack(accepted=False, reason="no forward state for this microbatch here")
        if record.backward_received:
            return Ack(duplicate=True)
        record.backward_received = True
        self.outbox.backward_arrived(key, meta, sender)
        rc = meta.tags.get("rc", 0)
        self.background.spawn(self._backward(key, record, tensor, rc if isinstance(rc, int) else 0), f"backward {key}")
        return Ack()

    async def _forwards_sent(self, iteration: int, timeout_s: float = 5.0) -> None:
        """Until every forward of ``iteration`` received here went on (a next hop took it), at most ``timeout_s``:
        a crash armed before the backward then always finds the next stage holding every one (a gradient
        can overtake a forward still queued on the compute thread)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline and any(
                r.meta.microbatch.iteration == iteration and not r.done
                and ((kept := self.outbox.get(key)) is None or kept.busy or kept.hop is None)
                for key, r in list(self.hops.records.items())):
            await asyncio.sleep(0.01)

    # -- work -------------------------------------------------------------------------------------
    async def _forward(self, key: str, record: HopRecord, tensor: torch.Tensor) -> None:
        if not await self.gate.reach(record.meta.microbatch.iteration, self.wait_for_step_s):
            logger.warning("dropping %s: this stage did not reach its iteration", key)
            self.hops.drop([key])
            return
        if self.hops.get(key) is not record:
            return  # dropped meanwhile (its data holder died)
        output, seconds = await self.compute.timed(lambda: self.executor.forward(key, tensor).cpu())
        record.forward_s = seconds
        if self.hops.get(key) is not record:
            await self.compute.run(self.executor.drop, key)
            return
        crashpoints.hit("exit_after_forward", self.stage, record.meta.microbatch.iteration, self.events)
        tags = dict(record.meta.tags)
        record.recomputed = "lost" in tags
        self.recomputes += record.recomputed
        meta = TransferMeta(microbatch=record.meta.microbatch, stage=self.outbox.next_stage,
                            flow_unit=record.meta.flow_unit, path=(*record.meta.path, self.self_id),
                            tags=tags if tags.get("rejoin") else {})
        self.forwards += 1
        await self.outbox.send(meta, output, self._next_hop(record))

    def _next_hop(self, record: HopRecord) -> Hop | None:
        then = record.meta.tags.get(f"then.{self.outbox.next_stage}")
        if isinstance(then, str) and not self.is_dead(then):
            return Hop(then, "")  # a recovery: rejoin the node that still holds this microbatch
        hop = self.routing.next_hop(record.meta.flow_unit)
        if hop is not None and not self.is_dead(hop.peer):
            return hop
        if self.stage == self.n_stages:  # the sink is the microbatch's data holder
            return Hop(record.meta.microbatch.data_holder, "")
        logger.info("unit %s of %s is gone; sending it to the cheapest next replica",
                    record.meta.flow_unit, record.meta.microbatch.key)
        return self.routing.fallback_hop()

    async def _backward(self, key: str, record: HopRecord, grad: torch.Tensor, rc: int) -> None:
        iteration = record.meta.microbatch.iteration

        def backward() -> torch.Tensor | None:  # the part may have re-synced past it since it arrived
            if self._over(iteration):
                return None
            return self.executor.backward(key, grad, record.meta.microbatch.data_holder).cpu()

        grad_in, seconds = await self.compute.timed(backward)
        if grad_in is None:
            logger.info("dropping the backward of %s: this part re-synced past iteration %d", key, iteration)
            return
        self.compute_s.add(record.forward_s + seconds)
        record.rc = rc + int(record.recomputed)
        self.backwards += 1
        await self.receiver.gradient_ready(key, record, grad_in)

    # -- deaths and steps -------------------------------------------------------------------------
    def peer_dead(self, peer: str) -> None:
        """The failure detector found ``peer`` dead: drop its microbatches if it was their data holder,
        resend what it took from us."""
        self.background.spawn(self._peer_dead(peer), f"peer {peer} dead")

    async def _peer_dead(self, peer: str) -> None:
        keys = self.hops.of_holder(peer)
        if keys:
            self.hops.drop(keys)
            self.outbox.drop(keys)
            freed = await self.compute.run(lambda: sum(self.executor.drop(k) for k in keys))
            logger.info("data holder %s is gone: dropped %d microbatches (%d with forward state)", peer, len(keys),
                        freed)
            self.events.emit("recovery", kind="dh_dropped", microbatch=None, data_holder=peer, stage=self.stage,
                             microbatches=len(keys), freed=freed, recomputed_hops=0, extra_s=0.0)
        await self.recovery.peer_dead(peer)

    async def count_only(self, data_holders: tuple[str, ...] | None) -> None:
        """The iteration's contribution counts the microbatches of ``data_holders`` only (None: all)."""
        await self.compute.run(self.executor.count_only, data_holders)

    def end_iteration(self, iteration: int) -> None:
        """Forget the hop records and kept outputs of ``iteration`` and earlier (after this stage's step); what a
        redo of ``iteration`` needs stays until the next step (a slower replica of a neighbouring stage may ask
        after this one stepped: the stages' norms came from faster replicas)."""
        self.hops.drop_through(iteration)
        self.outbox.drop_through(iteration)

    def last_iteration(self, last: int) -> int:
        """The latest iteration this relay holds work of (queued microbatches included), at least ``last``."""
        return max([last, *self.hops.iterations()])

    def refuse_after(self, iteration: int) -> None:
        """Leaving: forwards of later iterations are refused (their senders resend them elsewhere)."""
        self.accept_until = iteration

    @property
    def in_flight(self) -> int:
        return self.hops.in_flight

    async def close(self) -> None:
        await self.background.close()


class RelayRole:
    """A relay's ``IterationRole``: an iteration is over when the data holders close it; report the step."""

    def __init__(self, path: RelayPath, *, closing: Closing, clip: GlobalClip | None, gate: IterationGate,
                 events: Events, poll_s: float) -> None:
        self.path = path
        self.closing = closing
        self.clip = clip  # None: the run clips each part by its own norm
        self.gate = gate
        self.events = events
        self.poll_s = poll_s

    async def until_over(self, t: int, stop: asyncio.Event, abort: asyncio.Event) -> dict[str, Any] | None:
        """Relays step on while leaving (``stop``) until the leave is over (``abort``). Once over, the part
        counts the microbatches of the data holders whose contributions the data holders' aggregation kept
        (``Closed.data_holders``): a data holder that died mid-iteration counts in every part or in none."""
        while not abort.is_set():
            if await self.gate.wait_closed(t, self.poll_s) or self.closing.closed_elsewhere(t):
                if self.closing.data_holders(t) is None:  # closed by a replica or the records: the message may follow
                    await self.gate.wait_closed(t, self.poll_s)
                members = self.closing.data_holders(t)
                if members is None:
                    logger.warning("iteration %d: closed without the data holders' members; counting every "
                                   "microbatch this part took", t)
                await self.path.count_only(members)
                return {}
        return None

    async def clip_norm(self, t: int, gathered: Gathered) -> float | None:
        """Our part's squared norm to the data holders; the whole model's back (global clipping)."""
        return None if self.clip is None else await self.clip.total_for_stage(t, gathered.sq_norm)

    def end_iteration(self, t: int) -> None:
        self.path.end_iteration(t)

    async def stepped(self, t: int, outcome: Outcome) -> None:
        self.events.emit("step", stage=self.path.stage, iteration=t, hash=outcome.step.state_hash,
                         count=outcome.step.count, members=list(outcome.members), own_count=self.path.backwards,
                         agreement=outcome.how, dropped=list(outcome.dropped), seconds=round(outcome.seconds, 4),
                         clip_scale=outcome.step.clip_scale)
