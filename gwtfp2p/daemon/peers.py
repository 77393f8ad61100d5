"""Turns the DHT view into neighbours: link emulation, connections, RTT probes, flow costs, members.

A peer appearing in the view gets its location (link emulation), a connection at the addresses
it published and a first ping; a previous-, same- or next-stage peer becomes a flow neighbour,
with the paper's edge cost from both compute times and the measured RTT/bandwidth. Same-stage
peers are told our aggregation membership. Every ``probe_s`` neighbours are pinged again and
their costs updated (with hysteresis). A peer gone from the view is lost for the flow.

Liveness (crash detection): a peer is *suspected* when its record expires, a probe or transfer to
it fails or a recovery reports it; a suspect is pinged and, if that fails, declared dead
(``liveness.DeadPeers``): it leaves the flow and ``on_dead`` listeners (the data plane, anyone
else) are told. Its lingering DHT record is ignored until a newer heartbeat revives it. This is
also the ``Network`` the data plane's recovery uses (probes, queries, round-trip model).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from gwtfp2p.daemon.control import Member, encode_control
from gwtfp2p.daemon.links import LinkTable
from gwtfp2p.daemon.liveness import DeadPeers
from gwtfp2p.daemon.members import MemberTable
from gwtfp2p.daemon.membership import SwarmView
from gwtfp2p.daemon.recovery_wire import RecoveryMessage, encode_recovery
from gwtfp2p.daemon.routing import FlowDriver
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.timeouts import RoundTripModel, transfer_timeout_s
from gwtfp2p.dht import NodeRecord
from gwtfp2p.transport import PeerUnreachable, Transport, TransportError

logger = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5.0
PING_TIMEOUT_S = 5.0
RECOVERY_SEND_TIMEOUT_S = 5.0


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
        self.liveness = DeadPeers()
        self.on_dead: list[Callable[[str], None]] = []  # told once per peer declared dead
        self._checking: set[str] = set()

    # -- ViewListener ---------------------------------------------------------------------------
    def peer_joined(self, record: NodeRecord) -> None:
        if not self.liveness.seen(record.peer_id, record.updated_at):
            return  # the stale record of a peer we found dead
        if self.transport.link is not None:
            self.transport.link.set_peer_location(record.peer_id, record.location)
        if record.state == "online":
            self._introducing.add(record.peer_id)
            self.background.spawn(self._introduce(record), f"introduce {record.peer_id}")

    def peer_updated(self, record: NodeRecord) -> None:
        """A joining peer that came online is introduced now."""
        if not self.liveness.seen(record.peer_id, record.updated_at):
            return
        if record.peer_id not in self._introducing:
            self.peer_joined(record)
        elif self.transport.link is not None:
            self.transport.link.set_peer_location(record.peer_id, record.location)

    def peer_left(self, peer: str, record: NodeRecord | None) -> None:
        leaving = record is not None and record.state == "leaving"
        logger.info("peer %s left (%s)", peer, "leaving" if leaving else "record expired")
        self.routing.lose_neighbour(peer)
        self.links.forget(peer)
        self._introducing.discard(peer)
        # Aggregation membership is kept: a late heartbeat is not a crash. A leaving peer finishes its
        # in-flight work; an expired one is probed, and declared dead if it does not answer.
        if not leaving:
            self.suspect(peer)

    def lost(self, peer: str) -> None:
        """Repeated send failures: treat the peer as gone until the DHT shows it again, and probe it."""
        if self.routing.knows(peer):
            logger.warning("peer %s does not answer; dropping it from the flow", peer)
            self.routing.lose_neighbour(peer)
            self.view.records.pop(peer, None)
            self._introducing.discard(peer)
        self.suspect(peer)

    # -- liveness -------------------------------------------------------------------------------
    def is_dead(self, peer: str) -> bool:
        return self.liveness.is_dead(peer)

    def suspect(self, peer: str) -> None:
        """Probe ``peer`` soon (once at a time); declare it dead if it does not answer."""
        if peer == self.self_id or self.liveness.is_dead(peer) or peer in self._checking:
            return
        self._checking.add(peer)
        self.background.spawn(self.alive(peer), f"liveness of {peer}")

    async def alive(self, peer: str) -> bool:
        """Ping ``peer`` (twice if the first dial fails at once); False, and it is declared dead, if
        it does not answer within an adaptive deadline."""
        if self.liveness.is_dead(peer):
            return False
        self._checking.add(peer)
        try:
            for attempt in range(2):
                ok, unreachable = await self._ping_once(peer)
                if ok:
                    return True
                if not unreachable or attempt == 1:
                    break
                await asyncio.sleep(0.2)
            self.declare_dead(peer)
            return False
        finally:
            self._checking.discard(peer)

    async def _ping_once(self, peer: str) -> tuple[bool, bool]:
        timeout = transfer_timeout_s(self.links.rtt(peer), 0, self.links.bandwidth(peer))
        try:
            result = await self.transport.ping(peer, timeout_s=timeout)
        except TransportError as e:
            logger.debug("liveness ping of %s failed: %s", peer, e)
            return False, isinstance(e, PeerUnreachable)
        self.links.observe_rtt(peer, result.rtt_s)
        return True, False

    def declare_dead(self, peer: str) -> None:
        if not self.liveness.declare(peer):
            return
        logger.warning("peer %s is dead (no answer to a liveness probe)", peer)
        self.routing.lose_neighbour(peer)
        self._introducing.discard(peer)
        for listener in list(self.on_dead):
            listener(peer)

    # -- what the data plane's recovery uses (``recovery.Network``) -----------------------------
    def candidates(self, stages: set[int]) -> list[str]:
        """Live peers of the run serving one of ``stages``."""
        return sorted(p for p, r in self.view.records.items() if r.stage in stages and not self.is_dead(p))

    def rtt(self, peer: str) -> float | None:
        return self.links.rtt(peer)

    def round_trip_model(self, peer: str, hops: int, queue_depth: int) -> RoundTripModel:
        rtt = self.links.rtt(peer) or 0.0
        link_s = rtt / 2 + self.activation_bytes / self.links.bandwidth(peer)
        if self.transport.link is not None:
            link_s += self.transport.link.delay_s(peer, self.activation_bytes)
        record = self.view.records.get(peer)
        compute = record.compute_s if record is not None and record.compute_s > 0 else self.own_compute_s()
        return RoundTripModel(hops, link_s, compute, queue_depth)

    async def send_recovery(self, peer: str, message: RecoveryMessage) -> bool:
        try:
            await self.transport.send_flow(peer, encode_recovery(message), timeout_s=RECOVERY_SEND_TIMEOUT_S)
            return True
        except TransportError as e:
            logger.debug("recovery message to %s lost: %s", peer, e)
            self.suspect(peer)
            return False

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
                if not ok:
                    self.suspect(peer)
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
