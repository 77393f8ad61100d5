"""Drives this node's ``FlowNode`` over RPC: ticks, flow messages in and out, neighbour costs.

The flow protocol is sans-IO; here it meets the network. A tick runs every ``tick_s`` seconds;
outgoing envelopes go to a per-peer outbox whose worker batches whatever is queued into one
``send_flow`` (order kept per peer, one deadline per send). Repeated send failures report the
peer as unreachable to its subscribers. Measured edge costs reach the flow through ``SettledCosts``
(only changes that outlast measurement noise). The data plane reads the routing through
``next_hop``/``first_hops``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gwtfp2p.daemon.wire import encode_flow
from gwtfp2p.flow.costs import SettledCosts
from gwtfp2p.flow.messages import Envelope, Message
from gwtfp2p.flow.node import FlowNode, Route
from gwtfp2p.transport import TransportError

logger = logging.getLogger(__name__)
MAX_BATCH = 64
FAILURES_TO_LOSE = 3


class FlowSender(Protocol):
    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None: ...


@dataclass(frozen=True)
class Hop:
    """Where a microbatch goes next: the peer and the edge-unit id to tag the transfer with."""

    peer: str
    unit: str


class _PeerQueue:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[Message] = asyncio.Queue()
        self.task: asyncio.Task | None = None
        self.failures = 0


class FlowDriver:
    """One node's flow protocol on the wire."""

    def __init__(self, flow: FlowNode, n_stages: int, transport: FlowSender, tick_s: float,
                 send_timeout_s: float, costs: SettledCosts | None = None) -> None:
        self.flow = flow
        self.settled = costs or SettledCosts()
        self.transport = transport
        self.tick_s = tick_s
        self.send_timeout_s = send_timeout_s
        self.now = 0
        self._unreachable: list[Callable[[str], None]] = []
        self._outboxes: dict[str, _PeerQueue] = {}
        self._stages: dict[str, int] = {}
        self.next_stage = 0 if flow.stage == n_stages else flow.stage + 1
        self._routes_version = -1
        self._routes: list[Route] = []
        self.messages_in = 0
        self._logged_units: list[str] = []

    def subscribe_unreachable(self, listener: Callable[[str], None]) -> None:
        """``listener(peer)`` is called when flow messages to ``peer`` failed ``FAILURES_TO_LOSE`` times in a row."""
        self._unreachable.append(listener)

    # -- neighbours ---------------------------------------------------------------------------
    def add_neighbour(self, peer: str, stage: int, cost: float | None) -> None:
        if cost is not None:
            self.settled.offer(peer, cost)
            cost = self.settled.held(peer)
        self._stages[peer] = stage
        self._dispatch(self.flow.add_neighbour(peer, stage, cost, self.now))

    def update_cost(self, peer: str, cost: float) -> None:
        """A new measurement of the edge to ``peer``: re-cost it once the change outlasts the noise."""
        if not self.flow.has_neighbour(peer):
            return
        settled = self.settled.offer(peer, cost)
        if settled is not None:
            self._dispatch(self.flow.set_edge_cost(peer, settled, self.now))

    def lose_neighbour(self, peer: str) -> None:
        self.settled.forget(peer)
        self._stages.pop(peer, None)
        self._dispatch(self.flow.lose_neighbour(peer, self.now))
        outbox = self._outboxes.pop(peer, None)
        if outbox is not None and outbox.task is not None:
            outbox.task.cancel()

    def set_capacity(self, capacity: int) -> None:
        self._dispatch(self.flow.set_capacity(capacity, self.now))

    def knows(self, peer: str) -> bool:
        return self.flow.has_neighbour(peer)

    def neighbours(self, stage: int | None = None) -> list[str]:
        """Flow neighbours (of ``stage`` if given), sorted."""
        return sorted(p for p, k in self._stages.items() if stage is None or k == stage)

    def cost(self, peer: str) -> float | None:
        return self.settled.held(peer)

    # -- driving ------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set."""
        while not stop.is_set():
            self.now += 1
            self._dispatch(self.flow.on_tick(self.now))
            self._log_units()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.tick_s)

    def _log_units(self) -> None:
        """At INFO, this node's units whenever one of them changed (edge, neighbour, epoch, flags)."""
        if not logger.isEnabledFor(logging.INFO):
            return
        units = self.flow.unit_states()
        if units != self._logged_units:
            self._logged_units = units
            logger.info("flow units at tick %d: %s", self.now, "; ".join(units) or "none")

    def on_messages(self, sender: str, messages: list[Message]) -> None:
        """Messages from ``sender``; ones claiming another sender are dropped."""
        for message in messages:
            if getattr(message, "sender", None) != sender:
                logger.debug("dropping a flow message from %s claiming sender %s", sender,
                             getattr(message, "sender", None))
                continue
            self.messages_in += 1
            self._dispatch(self.flow.on_message(message, self.now))

    def _dispatch(self, envelopes: list[Envelope]) -> None:
        for envelope in envelopes:
            outbox = self._outboxes.get(envelope.dst)
            if outbox is None:
                outbox = self._outboxes[envelope.dst] = _PeerQueue()
            outbox.queue.put_nowait(envelope.message)
            if outbox.task is None or outbox.task.done():
                outbox.task = asyncio.create_task(self._drain(envelope.dst, outbox))

    async def _drain(self, peer: str, outbox: _PeerQueue) -> None:
        while not outbox.queue.empty():
            batch = [outbox.queue.get_nowait()]
            while not outbox.queue.empty() and len(batch) < MAX_BATCH:
                batch.append(outbox.queue.get_nowait())
            try:
                await self.transport.send_flow(peer, encode_flow(batch), timeout_s=self.send_timeout_s)
                outbox.failures = 0
            except TransportError as e:
                outbox.failures += 1
                logger.debug("flow messages to %s lost (%d in a row): %s", peer, outbox.failures, e)
                if outbox.failures >= FAILURES_TO_LOSE:
                    for listener in list(self._unreachable):
                        listener(peer)
                    return

    async def close(self) -> None:
        tasks = [o.task for o in self._outboxes.values() if o.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- what the data plane reads ------------------------------------------------------------
    def routes(self) -> list[Route]:
        if self._routes_version != self.flow.routing_version:
            self._routes = self.flow.routing_table()
            self._routes_version = self.flow.routing_version
        return self._routes

    def first_hops(self) -> list[Hop]:
        """A data holder's complete flow units (first hop of each), in a stable order."""
        return [Hop(h.next, h.edge_id) for h in self.flow.out_hops() if h.confirmed and h.complete]

    def next_hop(self, in_unit: str) -> Hop | None:
        """The next hop of the unit a microbatch arrived on (None if this node no longer has it)."""
        hop = self.flow.next_hop(in_unit) if in_unit else None
        return None if hop is None else Hop(hop.next, hop.edge_id)

    def fallback_hop(self, exclude: set[str] | frozenset[str] = frozenset()) -> Hop | None:
        """The cheapest next-stage neighbour not in ``exclude``, for a microbatch whose unit vanished
        meanwhile or whose next hop refused it."""
        costs = {p: self.settled.held(p) for p in self.neighbours(self.next_stage) if p not in exclude}
        best = min((p for p, c in costs.items() if c is not None), key=lambda p: (costs[p], p), default=None)
        return None if best is None else Hop(best, "")

    def other_first_hop(self, exclude: set[str]) -> Hop | None:
        """A data holder's alternative first hop: another complete unit's, else the cheapest neighbour."""
        for hop in self.first_hops():
            if hop.peer not in exclude:
                return hop
        return self.fallback_hop(exclude)

    def summary(self) -> list[tuple[str, str, int]]:
        """(next peer, sink, units) of this node's routed units, for its DHT record."""
        counts = Counter((r.next, r.sink) for r in self.routes() if r.next and r.out_edge and r.complete)
        return [(nxt, sink, n) for (nxt, sink), n in sorted(counts.items())]
