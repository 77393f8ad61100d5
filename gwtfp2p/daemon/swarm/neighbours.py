"""Turns the DHT view into flow neighbours: link emulation, connections, RTT probes, edge costs.

A peer appearing in the view gets its location (link emulation), a connection at the addresses it
published and a first ping; a previous-, same- or next-stage peer becomes a flow neighbour, with the
paper's edge cost from both compute times and the measured RTT/bandwidth, and a same-stage peer is
told our aggregation membership. Every ``probe_s`` neighbours are pinged again and re-costed (with
hysteresis). A peer that left the view, was found dead, or stopped taking flow messages leaves the flow;
an expired or unreachable one is suspected (``liveness``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.daemon.swarm.liveness import Liveness
from gwtfp2p.daemon.swarm.routing import FlowDriver
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.dht import NodeRecord
from gwtfp2p.transport import LinkEmulator, TransportError

logger = logging.getLogger(__name__)


def neighbour_stages(stage: int, n_stages: int) -> set[int]:
    """Stages whose nodes are flow neighbours of a node of ``stage`` (previous, same and next)."""
    nxt = 0 if stage == n_stages else stage + 1
    prev = n_stages if stage == 0 else stage - 1
    return {prev, stage, nxt}


class Dialer(Protocol):
    link: LinkEmulator | None

    async def connect(self, peer: str, maddrs: Sequence[str], *, timeout_s: float) -> None: ...


class MemberAnnouncer(Protocol):
    async def send_member(self, peer: str) -> None: ...


class Neighbours:
    """The ``SwarmView`` listener of one node: who its flow neighbours are and what their edges cost."""

    def __init__(self, self_id: str, stage: int, n_stages: int, *, dialer: Dialer, view: SwarmView,
                 links: LinkTable, routing: FlowDriver, liveness: Liveness, announcer: MemberAnnouncer,
                 own_compute_s: Callable[[], float], activation_bytes: int, timings: Timings) -> None:
        self.self_id = self_id
        self.stage = stage
        self.n_stages = n_stages
        self.dialer = dialer
        self.view = view
        self.links = links
        self.routing = routing
        self.liveness = liveness
        self.announcer = announcer
        self.own_compute_s = own_compute_s
        self.activation_bytes = activation_bytes
        self.timings = timings
        self.background = Background("neighbours")
        self._introducing: set[str] = set()  # peers introduced (or being introduced) to the flow
        liveness.subscribe(self.peer_dead)
        routing.subscribe_unreachable(self.lost)

    # -- ViewListener ---------------------------------------------------------------------------
    def peer_joined(self, record: NodeRecord) -> None:
        if not self.liveness.seen(record.peer_id, record.updated_at):
            return  # the stale record of a peer we found dead
        self._locate(record)
        if record.state == "online":
            self._introducing.add(record.peer_id)
            self.background.spawn(self._introduce(record), f"introduce {record.peer_id}")

    def peer_updated(self, record: NodeRecord) -> None:
        """A joining peer that came online is introduced now."""
        if not self.liveness.seen(record.peer_id, record.updated_at):
            return
        if record.peer_id not in self._introducing:
            self.peer_joined(record)
        else:
            self._locate(record)

    def peer_left(self, peer: str, record: NodeRecord | None) -> None:
        leaving = record is not None and record.state == "leaving"
        logger.info("peer %s left (%s)", peer, "leaving" if leaving else "record expired")
        self.routing.lose_neighbour(peer)
        self.links.forget(peer)
        self._introducing.discard(peer)
        # Aggregation membership is kept: a late heartbeat is not a crash. A leaving peer finishes its
        # in-flight work; an expired one is probed, and declared dead if it does not answer.
        if not leaving:
            self.liveness.suspect(peer)

    def _locate(self, record: NodeRecord) -> None:
        if self.dialer.link is not None:
            self.dialer.link.set_peer_location(record.peer_id, record.location)

    # -- losses ---------------------------------------------------------------------------------
    def lost(self, peer: str) -> None:
        """Flow messages to ``peer`` keep failing: out of the flow until the DHT shows it again; probe it."""
        if self.routing.knows(peer):
            logger.warning("peer %s does not answer; dropping it from the flow", peer)
            self.routing.lose_neighbour(peer)
            self.view.forget(peer)
            self._introducing.discard(peer)
        self.liveness.suspect(peer)

    def peer_dead(self, peer: str) -> None:
        self.routing.lose_neighbour(peer)
        self._introducing.discard(peer)

    # -- introductions and probes ---------------------------------------------------------------
    async def _introduce(self, record: NodeRecord) -> None:
        peer = record.peer_id
        if record.maddrs:
            with contextlib.suppress(TransportError):
                await self.dialer.connect(peer, record.maddrs, timeout_s=self.timings.connect_timeout_s)
        await self.liveness.ping(peer)
        if peer not in self.view.records or record.stage not in neighbour_stages(self.stage, self.n_stages):
            return
        if record.stage == self.stage:
            self.routing.add_neighbour(peer, record.stage, None)
            await self.announcer.send_member(peer)
        else:
            self.routing.add_neighbour(peer, record.stage, self._cost(peer))

    def _cost(self, peer: str) -> float | None:
        record = self.view.records.get(peer)
        peer_compute = record.compute_s if record is not None else 0.0
        return self.links.edge_cost(peer, self.own_compute_s(), peer_compute, self.activation_bytes)

    async def probe_loop(self, stop: asyncio.Event) -> None:
        """Every ``probe_s``: ping the other stages' neighbours, suspect the silent, re-cost the rest."""
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.timings.probe_s)
            same_stage = set(self.routing.neighbours(self.stage))
            peers = [p for p in self.routing.neighbours() if p not in same_stage]
            results = await asyncio.gather(*(self.liveness.ping(p) for p in peers))
            for peer, ok in zip(peers, results, strict=True):
                if not ok:
                    self.liveness.suspect(peer)
                cost = self._cost(peer) if ok else None
                if cost is not None:
                    self.routing.update_cost(peer, cost)

    async def close(self) -> None:
        await self.background.close()
