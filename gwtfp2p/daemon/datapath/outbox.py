"""The normal send path of a node's outputs: send on, keep until the gradient is back, watch the deadline.

Every node that sends activations on (a data holder's head, every relay) hands each output to its
``Outbox``: it goes to the chosen hop (failing over to another replica of the next stage if that one
refuses or is unreachable) and is kept (``KeptTable``) with a backward deadline from the round-trip
model (``timeouts``) until its gradient arrives; then the measured round trip feeds the EMA, or, for a
resent output, a ``recovery`` event reports what the loss cost. What passes its deadline is handed to
the recovery (``recovery``). Every gradient back is noted for its hop (``delivery``: a hop that takes
outputs and delivers nothing is failed by the recovery). The clock is injected; nothing here decides a
peer's fate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gwtfp2p.daemon.datapath.delivery import DeliveryWatch
from gwtfp2p.daemon.datapath.kept import Kept, KeptTable
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.swarm.links import Ema
from gwtfp2p.daemon.swarm.routing import Hop
from gwtfp2p.daemon.testing import misbehave
from gwtfp2p.daemon.timeouts import Deadlines, RoundTripModel
from gwtfp2p.transport import TransferMeta

OtherHop = Callable[[TransferMeta, set[str]], Hop | None]
RoundTrips = Callable[[str, int, int], RoundTripModel]  # (next peer, hops, queue depth) -> model


class ForwardSender(Protocol):
    async def forward_with_failover(self, hop: Hop | None, meta: TransferMeta, tensor: Any,
                                    other: Callable[[set[str]], Hop | None]) -> Hop | None: ...


class Outbox:
    """Kept outputs of one node of stage ``stage`` (0 for a data holder's head) and their deadlines."""

    def __init__(self, stage: int, n_stages: int, *, sender: ForwardSender, other_hop: OtherHop,
                 round_trips: RoundTrips, deadlines: Deadlines, events: Events, clock: Callable[[], float],
                 retry_nobody_s: float, unproductive_probes: int = 3) -> None:
        self.stage = stage
        self.n_stages = n_stages
        self.sender = sender
        self.other_hop = other_hop  # another next hop for an output whose hop refused or was lost
        self.round_trips = round_trips
        self.deadlines = deadlines
        self.events = events
        self.clock = clock
        self.retry_nobody_s = retry_nobody_s
        self.table = KeptTable()
        self.round_trip = Ema(0.2)
        self.deliveries = DeliveryWatch(unproductive_probes)
        self.next_stage = 0 if stage == n_stages else stage + 1  # the stage of our next hops
        self.returned: dict[str, tuple[str, Kept]] = {}  # key -> (who sent its gradient, the output) until the step

    def deadline(self, hop: Hop | None) -> tuple[float, float]:
        """(backward deadline, expected round trip) of an output handed to ``hop``."""
        hops = self.n_stages - self.stage + 1
        model = self.round_trips(hop.peer if hop else "", hops, len(self.table))
        return self.deadlines.backward_s(self.round_trip.value, model), max(self.round_trip.get(), model.expected_s())

    async def send(self, meta: TransferMeta, output: Any, hop: Hop | None) -> Hop | None:
        """Send ``output`` to ``hop`` (failing over to other replicas) and keep it until its gradient is back."""
        output = misbehave.corrupted(output)  # tests only: a corrupting volunteer ($GWTF_MISBEHAVE)
        wait_s, expected_s = self.deadline(hop)
        kept = self.table.add(meta.microbatch.key, meta, output, hop, self.clock(), wait_s, expected_s)
        kept.busy = True
        try:
            took = await self.send_kept(kept, hop, meta, lambda tried: self.other_hop(meta, tried))
        finally:
            kept.busy = False
        if took is None:
            kept.deadline_at = self.clock() + self.retry_nobody_s
        return took

    async def send_kept(self, kept: Kept, hop: Hop | None, meta: TransferMeta,
                        other: Callable[[set[str]], Hop | None]) -> Hop | None:
        """Send a kept output (again) as ``meta``; the hop that took it is recorded (None: nobody)."""
        took = await self.sender.forward_with_failover(hop, meta, kept.output, other)
        kept.hop = took
        return took

    async def retry(self, key: str) -> None:
        """Offer an output nobody took (or whose deadline passed with no hop) to the next stage again."""
        kept = self.table.get(key)
        if kept is None:
            return
        try:
            took = await self.send_kept(kept, self.other_hop(kept.meta, set()), kept.meta,
                                        lambda tried: self.other_hop(kept.meta, tried))
        finally:
            kept.busy = False
        wait_s, _ = self.deadline(took)
        kept.deadline_at = self.clock() + (wait_s if took is not None else self.retry_nobody_s)

    def backward_arrived(self, key: str, meta: TransferMeta, sender: str = "") -> bool:
        """The gradient of ``key`` is here (from ``sender``, the replica that added it to its part's sum): the
        output leaves the kept table for ``returned``; False if nothing was kept."""
        kept = self.table.get(key)
        if kept is not None and kept.hop is not None:
            self.deliveries.delivered(kept.hop.peer, self.clock())
        done = self.table.complete(key, self.clock())
        if done is None or kept is None:
            return False
        if sender:
            self.returned[key] = (sender, kept)
        if not done.resent:
            self.round_trip.add(done.round_trip_s)
        else:
            rc = meta.tags.get("rc", 1)
            self.events.emit("recovery", kind=done.kind, microbatch=key, stage=self.stage, lost=done.lost,
                             recomputed_hops=rc if isinstance(rc, int) else 1, extra_s=round(done.extra_s, 4),
                             detect_s=None if done.detect_s is None else round(done.detect_s, 4),
                             round_trip_s=round(done.round_trip_s, 4))
        return True

    def overdue(self) -> tuple[list[str], dict[str, list[str]]]:
        """Outputs past their deadline, now marked busy: (those nobody took, those by the peer that did)."""
        nobody: list[str] = []
        by_peer: dict[str, list[str]] = {}
        for key, kept in self.table.due(self.clock()):
            kept.busy = True
            if kept.hop is None:
                nobody.append(key)
            else:
                by_peer.setdefault(kept.hop.peer, []).append(key)
        return nobody, by_peer

    def probed(self, keys: list[str], alive: bool) -> None:
        """The probe of the hop that took ``keys`` is over; if it answered, wait longer for them."""
        now = self.clock()
        for key in keys:
            kept = self.table.get(key)
            if kept is not None:
                kept.busy = False
                if alive:
                    self.table.extend(key, now, self.deadlines.extended_s)

    def __contains__(self, key: str) -> bool:
        return key in self.table

    def __len__(self) -> int:
        return len(self.table)

    def get(self, key: str) -> Kept | None:
        return self.table.get(key)

    def returned_where(self, iteration: int, keep: Callable[[str, str], bool]) -> list[tuple[str, Kept]]:
        """(who, output) for the outputs of ``iteration`` whose gradient came back and ``keep(key, who)``
        holds, by key (``redo``: the work a step left out, or the keys a neighbour asks for)."""
        return [(sender, kept) for key, (sender, kept) in sorted(self.returned.items())
                if kept.meta.microbatch.iteration == iteration and keep(key, sender)]

    def drop(self, keys: list[str]) -> None:
        gone = set(keys)
        self.table.drop(lambda k, _e: k not in gone)
        self.returned = {k: v for k, v in self.returned.items() if k not in gone}

    def drop_through(self, iteration: int) -> None:
        """Forget outputs of ``iteration`` and earlier (the part stepped: nothing comes back for them); those of
        ``iteration`` whose gradient came back stay for redo requests until the next call (as ``HopTable``'s)."""
        self.table.drop(lambda _k, e: e.meta.microbatch.iteration > iteration)
        self.returned = {k: v for k, v in self.returned.items() if v[1].meta.microbatch.iteration >= iteration}
