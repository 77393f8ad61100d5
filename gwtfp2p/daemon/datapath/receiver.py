"""The one receive side of forwards, for relays and for a data holder's tail: hop records and gradients.

Every microbatch is named by its id (data holder, iteration, index) and deduplicated by it; its hop
record keeps who sent it and the path so far until the part steps. A duplicate forward from a new
sender that replaces a lost hop (tag ``lost`` on our recorded path, or our previous hop found dead)
re-points the record: the gradient goes to the new sender, at once if it is already computed (no
recompute here). A gradient that cannot reach the previous hop is reported upstream (``Lost``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.transport import Ack, MicrobatchId, TransferMeta

logger = logging.getLogger(__name__)
NEW, AGAIN, OTHER = "new", "again", "other"  # what ``HopReceiver.receive`` got


@dataclass
class HopRecord:
    """What this node holds for one microbatch it received until its part steps."""

    meta: TransferMeta  # as received with the forward (its path ends with the sender); replaced on a re-point
    prev: str  # where the gradient goes
    grad: torch.Tensor | None = None  # computed gradient, kept: a sender that replaces a lost hop gets it again
    rc: int = 0  # recomputed hops from here down, reported upstream with the gradient
    forward_s: float = 0.0  # relays: seconds of the forward
    recomputed: bool = False  # relays: the forward was a recovery's recompute (it carried a ``lost`` tag)
    backward_received: bool = False  # relays: the gradient from downstream arrived

    @property
    def done(self) -> bool:
        return self.grad is not None


class HopTable:
    """Hop records by microbatch key (pure bookkeeping)."""

    def __init__(self) -> None:
        self.records: dict[str, HopRecord] = {}
        # the done records of the iteration dropped last, for redo requests only (``sent_where``): a slower
        # replica of the next stage may ask after this part stepped (the stage's norm came from a faster one)
        self.stepped: dict[str, HopRecord] = {}

    def get(self, key: str) -> HopRecord | None:
        return self.records.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self.records

    def __len__(self) -> int:
        return len(self.records)

    def held(self, lost: str, mbs: Iterable[MicrobatchId]) -> list[MicrobatchId]:
        """Of ``mbs``, those held here with ``lost`` on their recorded path (the answer to ``Where``)."""
        return [mb for mb in mbs if (r := self.records.get(mb.key)) is not None and lost in r.meta.path]

    def sent_where(self, iteration: int, keep: Callable[[str, str], bool]) -> list[HopRecord]:
        """The records of ``iteration`` whose gradient went back to ``prev`` with ``keep(key, prev)``, by key
        (``redo``); the iteration dropped last is still asked here."""
        every = {**self.stepped, **self.records}
        return [r for key, r in sorted(every.items())
                if r.grad is not None and r.meta.microbatch.iteration == iteration and keep(key, r.prev)]

    def of_holder(self, data_holder: str) -> list[str]:
        return [k for k, r in self.records.items() if r.meta.microbatch.data_holder == data_holder]

    def drop(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.records.pop(key, None)

    def drop_through(self, iteration: int) -> None:
        """Forget the records of ``iteration`` and earlier (after the part's step); the done ones of ``iteration``
        stay for redo requests until the next call."""
        self.stepped = {k: r for k, r in self.records.items() if r.meta.microbatch.iteration == iteration and r.done}
        self.drop([k for k, r in self.records.items() if r.meta.microbatch.iteration <= iteration])

    def iterations(self) -> list[int]:
        return [r.meta.microbatch.iteration for r in self.records.values()]

    @property
    def in_flight(self) -> int:
        return sum(1 for r in self.records.values() if not r.done)


class Prober(Protocol):
    async def alive(self, peer: str) -> bool: ...


class GradientSender(Protocol):
    async def send(self, kind: str, peer: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack | None: ...


class LostReporter(Protocol):
    async def report_lost(self, meta: TransferMeta, lost: str, stage: int) -> bool: ...


class HopReceiver:
    """Receives forwards for stage ``stage`` (0: a data holder's tail) and sends their gradients back."""

    def __init__(self, stage: int, grad_stage: int, table: HopTable, *, sender: GradientSender, prober: Prober,
                 reporter: LostReporter, events: Events) -> None:
        self.stage = stage
        self.grad_stage = grad_stage  # the stage our gradients go to (the previous one)
        self.table = table
        self.sender = sender
        self.prober = prober
        self.reporter = reporter
        self.events = events
        self.gradient_resends = 0
        self.background = Background(f"receiver of stage {stage}")

    def receive(self, sender: str, meta: TransferMeta) -> tuple[HopRecord, str]:
        """The record of this forward and what it was: ``new``, ``again`` (a duplicate from the recorded
        previous hop: the caller decides) or ``other`` (from a new sender, which re-points the record if
        it replaces a lost hop)."""
        key = meta.microbatch.key
        record = self.table.get(key)
        if record is None:
            record = self.table.records[key] = HopRecord(meta, sender)
            return record, NEW
        if sender == record.prev:
            return record, AGAIN
        lost = meta.tags.get("lost")
        if isinstance(lost, str) and lost in record.meta.path:
            self._repoint(record, sender, meta)
        else:
            self.background.spawn(self._repoint_if_dead(record, sender, meta), f"check {record.prev}")
        return record, OTHER

    async def _repoint_if_dead(self, record: HopRecord, sender: str, meta: TransferMeta) -> None:
        if self.table.get(meta.microbatch.key) is record and not await self.prober.alive(record.prev):
            self._repoint(record, sender, meta)

    def _repoint(self, record: HopRecord, sender: str, meta: TransferMeta) -> None:
        key, lost = meta.microbatch.key, record.prev
        record.prev, record.meta = sender, meta
        kind = "repoint"
        if record.grad is not None:
            kind = "gradient_resend"
            self.gradient_resends += 1
            self.background.spawn(self.send_gradient(key, record), f"gradient {key}")
        logger.info("%s of %s: previous hop %s replaced by %s", kind, key, lost, sender)
        self.events.emit("recovery", kind=kind, microbatch=key, stage=self.stage, lost=lost, recomputed_hops=0,
                         extra_s=0.0)

    async def gradient_ready(self, key: str, record: HopRecord, grad: torch.Tensor) -> None:
        """The gradient of ``key`` is computed: keep it and send it to the previous hop."""
        record.grad = grad
        await self.send_gradient(key, record)

    async def send_gradient(self, key: str, record: HopRecord) -> None:
        prev, grad = record.prev, record.grad
        if grad is None:
            return
        meta = TransferMeta(microbatch=record.meta.microbatch, stage=self.grad_stage, flow_unit=record.meta.flow_unit,
                            path=record.meta.path, tags={"rc": record.rc})
        ack = await self.sender.send("backward", prev, meta, grad)
        if ack is not None and (ack.accepted or ack.duplicate):
            return
        if record.prev == prev and self.table.get(key) is record:  # not re-pointed meanwhile
            await self.reporter.report_lost(record.meta, prev, self.stage)

    async def close(self) -> None:
        await self.background.close()
