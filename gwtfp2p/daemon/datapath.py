"""A relay's data plane: forward and backward of microbatches through its stage.

Receivers acknowledge at once and queue the work (handlers must answer fast); the compute runs on
the one compute thread. Every microbatch is named by its id (data holder, iteration, index) and
deduplicated by it; its hop record keeps who sent it, the path so far, the unit it came on and
the output sent on, until the backward for it arrives (then the output is freed and the input
gradient goes back to the sender). Work of a later iteration waits for this stage's step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.gate import IterationGate
from gwtfp2p.daemon.links import Ema
from gwtfp2p.daemon.routing import FlowDriver, Hop
from gwtfp2p.daemon.sending import Sender
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.model.executor import StageExecutor
from gwtfp2p.transport import Ack, TransferMeta

logger = logging.getLogger(__name__)
WAIT_FOR_STEP_S = 120.0


@dataclass
class HopRecord:
    """What this relay holds for one microbatch until its backward is done."""

    meta: TransferMeta  # as received with the forward
    prev: str
    forward_s: float = 0.0
    output: torch.Tensor | None = None  # kept until the backward arrives
    next_hop: Hop | None = None
    backward_received: bool = False
    done: bool = False


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
        self.background = Background("relay data path")
        self.accept_until: int | None = None  # set when leaving: later iterations are refused

    # -- handlers (answer at once) ----------------------------------------------------------------
    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        key = meta.microbatch.key
        if meta.stage != self.stage:
            return Ack(accepted=False, reason=f"this relay serves stage {self.stage}, not {meta.stage}")
        if meta.microbatch.iteration < self.gate.iteration:
            return Ack(accepted=False, reason=f"iteration {meta.microbatch.iteration} is over here")
        if self.accept_until is not None and meta.microbatch.iteration > self.accept_until:
            return Ack(accepted=False, reason="this relay is leaving")
        if key in self.hops:
            return Ack(duplicate=True)
        self.hops[key] = HopRecord(meta, sender)
        self.background.spawn(self._forward(key, tensor), f"forward {key}")
        return Ack()

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        record = self.hops.get(meta.microbatch.key)
        if record is None or (record.output is None and not record.done):
            return Ack(accepted=False, reason="no forward state for this microbatch here")
        if record.backward_received:
            return Ack(duplicate=True)
        record.backward_received = True
        self.background.spawn(self._backward(meta.microbatch.key, record, tensor), f"backward {meta.microbatch.key}")
        return Ack()

    # -- work -------------------------------------------------------------------------------------
    async def _forward(self, key: str, tensor: torch.Tensor) -> None:
        record = self.hops[key]
        if not await self.gate.reach(record.meta.microbatch.iteration, WAIT_FOR_STEP_S):
            logger.warning("dropping %s: this stage did not reach its iteration", key)
            self.hops.pop(key, None)
            return
        output, seconds = await self.compute.timed(lambda: self.executor.forward(key, tensor).cpu())
        record.forward_s, record.output = seconds, output
        hop = self._next_hop(record)
        if hop is None:
            logger.warning("no next hop for %s (stage %d has no route yet)", key, self.stage)
            return
        meta = TransferMeta(microbatch=record.meta.microbatch, stage=self._next_stage(), flow_unit=hop.unit,
                            path=(*record.meta.path, self.self_id))
        self.forwards += 1
        other = (lambda _tried: None) if self.stage == self.n_stages else self.routing.fallback_hop
        record.next_hop = await self.sender.forward_with_failover(hop, meta, output, other)

    def _next_stage(self) -> int:
        return 0 if self.stage == self.n_stages else self.stage + 1

    def _next_hop(self, record: HopRecord) -> Hop | None:
        hop = self.routing.next_hop(record.meta.flow_unit)
        if hop is not None:
            return hop
        if self.stage == self.n_stages:  # the sink is the microbatch's data holder
            return Hop(record.meta.microbatch.data_holder, "")
        logger.info("unit %s of %s is gone; sending it to the cheapest next replica",
                    record.meta.flow_unit, record.meta.microbatch.key)
        return self.routing.fallback_hop()

    async def _backward(self, key: str, record: HopRecord, grad: torch.Tensor) -> None:
        grad_in, seconds = await self.compute.timed(lambda: self.executor.backward(key, grad).cpu())
        self.compute_s.add(record.forward_s + seconds)
        record.output, record.done = None, True  # the backward arrived: the kept output is no longer needed
        prev_stage = self.stage - 1
        meta = TransferMeta(microbatch=record.meta.microbatch, stage=prev_stage, flow_unit=record.meta.flow_unit,
                            path=record.meta.path)
        self.backwards += 1
        await self.sender.send("backward", record.prev, meta, grad_in)

    def end_iteration(self, iteration: int) -> None:
        """Forget the hop records of ``iteration`` and earlier (after this stage's step)."""
        for key in [k for k, r in self.hops.items() if r.meta.microbatch.iteration <= iteration]:
            del self.hops[key]

    async def close(self) -> None:
        await self.background.close()

    @property
    def in_flight(self) -> int:
        return sum(1 for r in self.hops.values() if not r.done)
