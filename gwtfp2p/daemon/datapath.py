"""A relay's data plane: forward and backward of microbatches through its stage, and its part in recovery.

Receivers acknowledge at once and queue the work (handlers must answer fast); the compute runs on
the one compute thread. Every microbatch is named by its id (data holder, iteration, index) and
deduplicated by it; its hop record keeps who sent it and the path so far until the stage steps.
The output sent on is kept (``Upstream``, ``recovery.py``) until its gradient is back, and resent
to another replica if the next hop is lost. A duplicate forward from a new sender that replaces a
lost hop (tag ``lost`` on our recorded path, or our previous hop found dead) re-points the
record: the gradient goes to the new sender, at once if it is already computed (no recompute
here). When the gradient cannot reach the previous hop, the nearest live hop upstream is told
(``Lost``). The microbatches of a data holder that died are dropped. Work of a later iteration
waits for this stage's step.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from gwtfp2p.daemon import crashpoints
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.gate import IterationGate
from gwtfp2p.daemon.links import Ema
from gwtfp2p.daemon.recovery import Network, Upstream, report_lost
from gwtfp2p.daemon.recovery_wire import RecoveryMessage
from gwtfp2p.daemon.routing import FlowDriver, Hop
from gwtfp2p.daemon.sending import Sender
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.transport import Ack, MicrobatchId, TransferMeta

if TYPE_CHECKING:
    from gwtfp2p.daemon.peers import PeerManager

logger = logging.getLogger(__name__)
WAIT_FOR_STEP_S = 120.0


@dataclass
class HopRecord:
    """What this relay holds for one microbatch until its stage steps."""

    meta: TransferMeta  # as received with the forward (its path ends with the sender); replaced on a re-point
    prev: str
    forward_s: float = 0.0
    recomputed: bool = False  # the forward was a recovery's recompute (it carried a ``lost`` tag)
    backward_received: bool = False
    done: bool = False
    grad_in: torch.Tensor | None = None  # kept: a sender that replaces a lost hop gets it again
    rc: int = 0  # recomputed hops from here down, reported upstream with the gradient


class RelayDataPath:
    """Forward/backward handling of stage ``stage`` on one relay."""

    def __init__(self, self_id: str, stage: int, n_stages: int, executor: StageExecutor,
                 compute: ComputeThread, sender: Sender, routing: FlowDriver, gate: IterationGate) -> None:
        self.self_id = self_id
        self.stage = stage
        self.n_stages = n_stages
        self.executor = executor
        self.compute = compute
        self.sender = sender
        self.routing = routing
        self.gate = gate
        self.hops: dict[str, HopRecord] = {}
        self.compute_s = Ema(0.2)
        self.forwards = 0
        self.backwards = 0
        self.recomputes = 0
        self.gradient_resends = 0
        self.background = Background("relay data path")
        self.accept_until: int | None = None  # set when leaving: later iterations are refused
        self.upstream = Upstream(self_id, stage, n_stages, sender, self._other_hop)
        self.upstream.held_here = self._held_here
        self.network: Network | None = None
        self.events: Events | None = None

    def attach(self, peers: PeerManager, events: Events) -> None:
        """Wire recovery to the node's peer management (liveness, queries) and its events."""
        self.network = self.upstream.network = peers
        self.events = self.upstream.events = events
        self.sender.on_failure = peers.suspect
        peers.on_dead.append(self.peer_dead)
        self.background.spawn(self.upstream.run(asyncio.Event()), "recovery deadlines")  # until close

    def _dead(self, peer: str) -> bool:
        return self.network is not None and self.network.is_dead(peer)

    # -- handlers (answer at once) ----------------------------------------------------------------
    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        reason = self._refusal(meta)
        if reason:
            return Ack(accepted=False, reason=reason)
        key = meta.microbatch.key
        record = self.hops.get(key)
        if record is not None:
            self._duplicate(sender, meta, record)
            return Ack(duplicate=True)
        self.hops[key] = HopRecord(meta, sender)
        self.background.spawn(self._forward(key, tensor), f"forward {key}")
        return Ack()

    def _refusal(self, meta: TransferMeta) -> str:
        if meta.stage != self.stage:
            return f"this relay serves stage {self.stage}, not {meta.stage}"
        if meta.microbatch.iteration < self.gate.iteration:
            return f"iteration {meta.microbatch.iteration} is over here"
        if self.accept_until is not None and meta.microbatch.iteration > self.accept_until:
            return "this relay is leaving"
        if self._dead(meta.microbatch.data_holder):
            return "its data holder is gone"
        return ""

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        crashpoints.hit("exit_before_backward", self.stage, meta.microbatch.iteration, self.events)
        key = meta.microbatch.key
        record = self.hops.get(key)
        if record is None or not (key in self.upstream or record.done):
            return Ack(accepted=False, reason="no forward state for this microbatch here")
        if record.backward_received:
            return Ack(duplicate=True)
        record.backward_received = True
        self.upstream.backward_arrived(key, meta)
        rc = meta.tags.get("rc", 0)
        self.background.spawn(self._backward(key, record, tensor, rc if isinstance(rc, int) else 0), f"backward {key}")
        return Ack()

    async def on_recovery(self, sender: str, message: RecoveryMessage) -> None:
        await self.upstream.on_message(sender, message)

    # -- duplicates: a new sender replacing a lost hop ----------------------------------------------
    def _duplicate(self, sender: str, meta: TransferMeta, record: HopRecord) -> None:
        key = meta.microbatch.key
        if sender != record.prev:
            lost = meta.tags.get("lost")
            if isinstance(lost, str) and lost in record.meta.path:
                self._repoint(record, sender, meta)
            elif self.network is not None:
                self.background.spawn(self._repoint_if_dead(record, sender, meta), f"check {record.prev}")
            return
        then = meta.tags.get(f"then.{self.upstream.lost_stage}")
        if isinstance(then, str) and key in self.upstream:  # resent to rejoin a holder we did not send it to
            self.background.spawn(self.upstream.redirect(key, Hop(then, ""), meta.tags), f"redirect {key}")

    async def _repoint_if_dead(self, record: HopRecord, sender: str, meta: TransferMeta) -> None:
        assert self.network is not None
        if self.hops.get(meta.microbatch.key) is record and not await self.network.alive(record.prev):
            self._repoint(record, sender, meta)

    def _repoint(self, record: HopRecord, sender: str, meta: TransferMeta) -> None:
        key, lost = meta.microbatch.key, record.prev
        record.prev, record.meta = sender, meta
        kind = "repoint"
        if record.grad_in is not None:
            kind = "gradient_resend"
            self.gradient_resends += 1
            self.background.spawn(self._send_grad(key, record), f"gradient {key}")
        logger.info("%s of %s: previous hop %s replaced by %s", kind, key, lost, sender)
        if self.events is not None:
            self.events.emit("recovery", kind=kind, microbatch=key, stage=self.stage, lost=lost,
                             recomputed_hops=0, extra_s=0.0)

    # -- work -------------------------------------------------------------------------------------
    async def _forward(self, key: str, tensor: torch.Tensor) -> None:
        record = self.hops[key]
        if not await self.gate.reach(record.meta.microbatch.iteration, WAIT_FOR_STEP_S):
            logger.warning("dropping %s: this stage did not reach its iteration", key)
            self.hops.pop(key, None)
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
        meta = TransferMeta(microbatch=record.meta.microbatch, stage=self.upstream.lost_stage,
                            flow_unit=record.meta.flow_unit, path=(*record.meta.path, self.self_id),
                            tags=tags if tags.get("rejoin") else {})
        self.forwards += 1
        await self.upstream.send(meta, output, self._next_hop(record))

    def _next_hop(self, record: HopRecord) -> Hop | None:
        then = record.meta.tags.get(f"then.{self.upstream.lost_stage}")
        if isinstance(then, str) and not self._dead(then):
            return Hop(then, "")  # a recovery: rejoin the node that still holds this microbatch
        hop = self.routing.next_hop(record.meta.flow_unit)
        if hop is not None and not self._dead(hop.peer):
            return hop
        if self.stage == self.n_stages:  # the sink is the microbatch's data holder
            return Hop(record.meta.microbatch.data_holder, "")
        logger.info("unit %s of %s is gone; sending it to the cheapest next replica",
                    record.meta.flow_unit, record.meta.microbatch.key)
        return self.routing.fallback_hop()

    def _other_hop(self, meta: TransferMeta, exclude: set[str]) -> Hop | None:
        """Another next hop for a forward its first choice did not take (or lost)."""
        if self.stage == self.n_stages:
            holder = meta.microbatch.data_holder
            return None if holder in exclude or self._dead(holder) else Hop(holder, "")
        return self.routing.fallback_hop(exclude)

    async def _backward(self, key: str, record: HopRecord, grad: torch.Tensor, rc: int) -> None:
        grad_in, seconds = await self.compute.timed(lambda: self.executor.backward(key, grad).cpu())
        self.compute_s.add(record.forward_s + seconds)
        record.grad_in, record.done = grad_in, True
        record.rc = rc + int(record.recomputed)
        self.backwards += 1
        await self._send_grad(key, record)

    async def _send_grad(self, key: str, record: HopRecord) -> None:
        prev = record.prev
        meta = TransferMeta(microbatch=record.meta.microbatch, stage=self.stage - 1, flow_unit=record.meta.flow_unit,
                            path=record.meta.path, tags={"rc": record.rc})
        assert record.grad_in is not None
        ack = await self.sender.send("backward", prev, meta, record.grad_in)
        if ack is not None and (ack.accepted or ack.duplicate):
            return
        if record.prev == prev and self.hops.get(key) is record:  # not re-pointed meanwhile
            await report_lost(self.network, self.upstream, record.meta, prev, self.stage)

    # -- recovery bookkeeping ---------------------------------------------------------------------
    def _held_here(self, lost: str, mbs: tuple[MicrobatchId, ...]) -> list[MicrobatchId]:
        return [mb for mb in mbs if (r := self.hops.get(mb.key)) is not None and lost in r.meta.path]

    def peer_dead(self, peer: str) -> None:
        """``PeerManager`` found ``peer`` dead: drop its microbatches if it was their data holder,
        resend what it took from us."""
        self.background.spawn(self._peer_dead(peer), f"peer {peer} dead")

    async def _peer_dead(self, peer: str) -> None:
        keys = [k for k, r in self.hops.items() if r.meta.microbatch.data_holder == peer]
        if keys:
            for key in keys:
                self.hops.pop(key, None)
            self.upstream.drop(keys)
            freed = await self.compute.run(lambda: sum(self.executor.drop(k) for k in keys))
            logger.info("data holder %s is gone: dropped %d microbatches (%d with forward state)", peer, len(keys),
                        freed)
            if self.events is not None:
                self.events.emit("recovery", kind="dh_dropped", microbatch=None, data_holder=peer, stage=self.stage,
                                 microbatches=len(keys), freed=freed, recomputed_hops=0, extra_s=0.0)
        await self.upstream.peer_dead(peer)

    def end_iteration(self, iteration: int) -> None:
        """Forget the hop records of ``iteration`` and earlier (after this stage's step)."""
        for key in [k for k, r in self.hops.items() if r.meta.microbatch.iteration <= iteration]:
            del self.hops[key]
        self.upstream.drop_through(iteration)

    async def close(self) -> None:
        await self.background.close()
        await self.upstream.close()

    @property
    def in_flight(self) -> int:
        return sum(1 for r in self.hops.values() if not r.done)
