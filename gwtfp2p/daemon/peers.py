"""Turns the DHT view into neighbours: link emulation, connections, RTT probes, flow costs, members.

A peer appearing in the view gets its location (link emulation), a connection at the addresses
it published and a first ping; a previous-, same- or next-stage peer becomes a flow neighbour,
with the paper's edge cost from both compute times and the measured RTT/bandwidth. Same-stage
peers are told our aggregation membership. Every ``probe_s`` neighbours are pinged again and
their costs updated (with hysteresis). A peer gone from the view is lost for the flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from gwtfp2p.daemon.control import Member, encode_control
from gwtfp2p.daemon.links import LinkTable
from gwtfp2p.daemon.members import MemberTable
from gwtfp2p.daemon.membership import SwarmView
from gwtfp2p.daemon.routing import FlowDriver
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.dht import NodeRecord
from gwtfp2p.transport import Transport, TransportError

logger = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5.0
PING_TIMEOUT_S = 5.0


def neighbour_stages(stage: int, n_stages: int) -> set[int]:
    """Stages whose nodes are flow neighbours of a node of ``stage`` (previous, same and next)."""
    nxt = 0 if stage == n_stages else stage + 1
    prev = n_stages if stage == 0 else stage - 1
    return {prev, stage, nxt}


class PeerManager:
    """The ``SwarmView`` listener of one node."""

    def __init__(self, self_id: str, stage: int, n_stages: int, transport: Transport, view: SwarmView,
                 links: LinkTable, routing: FlowDriver, members: MemberTable, own_compute_s: Callable[[], float],
                 activation_bytes: int, probe_s: float) -> None:
        self.self_id = self_id
        self.stage = stage
        self.n_stages = n_stages
        self.transport = transport
        self.view = view
        self.links = links
        self.routing = routing
        self.members = members
        self.own_compute_s = own_compute_s
        self.activation_bytes = activation_bytes
        self.probe_s = probe_s
        self.background = Background("peers")
        self.announce = False  # set once this node's membership is settled
        self._introducing: set[str] = set()  # peers introduced (or being introduced) to the flow

    # -- ViewListener ---------------------------------------------------------------------------
    def peer_joined(self, record: NodeRecord) -> None:
        if self.transport.link is not None:
            self.transport.link.set_peer_location(record.peer_id, record.location)
        if record.state == "online":
            self._introducing.add(record.peer_id)
            self.background.spawn(self._introduce(record), f"introduce {record.peer_id}")

    def peer_updated(self, record: NodeRecord) -> None:
        """A joining peer that came online is introduced now."""
        if record.peer_id not in self._introducing:
            self.peer_joined(record)
        elif self.transport.link is not None:
            self.transport.link.set_peer_location(record.peer_id, record.location)

    def peer_left(self, peer: str, record: NodeRecord | None) -> None:
        logger.info("peer %s left (%s)", peer, "leaving" if record is not None and record.state == "leaving"
                    else "record expired")
        self.routing.lose_neighbour(peer)
        self.links.forget(peer)
        self._introducing.discard(peer)
        # Aggregation membership is kept: a late heartbeat is not a crash. A member whose contribution
        # does not come is dropped at the aggregation deadline (crash recovery: next issue).

    def lost(self, peer: str) -> None:
        """Repeated send failures: treat the peer as gone until the DHT shows it again."""
        if self.routing.knows(peer):
            logger.warning("peer %s does not answer; dropping it from the flow", peer)
            self.routing.lose_neighbour(peer)
            self.view.records.pop(peer, None)
            self._introducing.discard(peer)

    # -- introductions and probes ---------------------------------------------------------------
    async def _introduce(self, record: NodeRecord) -> None:
        peer = record.peer_id
        if record.maddrs:
            with contextlib.suppress(TransportError):
                await self.transport.connect(peer, record.maddrs, timeout_s=CONNECT_TIMEOUT_S)
        await self._ping(peer)
        if peer not in self.view.records or record.stage not in neighbour_stages(self.stage, self.n_stages):
            return
        if record.stage == self.stage:
            self.routing.add_neighbour(peer, record.stage, None)
            if self.announce:
                await self.send_member(peer)
        else:
            self.routing.add_neighbour(peer, record.stage, self._cost(peer))

    async def _ping(self, peer: str) -> bool:
        try:
            result = await self.transport.ping(peer, timeout_s=PING_TIMEOUT_S)
        except TransportError as e:
            logger.debug("ping %s failed: %s", peer, e)
            return False
        self.links.observe_rtt(peer, result.rtt_s)
        return True

    def _cost(self, peer: str) -> float | None:
        record = self.view.records.get(peer)
        peer_compute = record.compute_s if record is not None else 0.0
        return self.links.edge_cost(peer, self.own_compute_s(), peer_compute, self.activation_bytes)

    async def probe_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.probe_s)
            same_stage = set(self.routing.neighbours(self.stage))
            peers = [p for p in self.routing.neighbours() if p not in same_stage]
            results = await asyncio.gather(*(self._ping(p) for p in peers))
            for peer, ok in zip(peers, results, strict=True):
                cost = self._cost(peer) if ok else None
                if cost is not None:
                    self.routing.update_cost(peer, cost)

    # -- membership notices ---------------------------------------------------------------------
    async def send_member(self, peer: str) -> None:
        own = self.members.own
        message = Member(stage=self.stage, from_iteration=own.from_iteration, until_iteration=own.until_iteration)
        try:
            await self.transport.send_flow(peer, encode_control(message), timeout_s=PING_TIMEOUT_S)
        except TransportError as e:
            logger.debug("membership notice to %s lost: %s", peer, e)

    async def announce_to_stage(self) -> None:
        """Tell every same-stage peer in the view our membership (after a change)."""
        peers = [r.peer_id for r in self.view.by_stage(self.stage)]
        await asyncio.gather(*(self.send_member(p) for p in peers))

    async def close(self) -> None:
        await self.background.close()
