"""The swarm as the data plane asks about it: live peers of given stages, RTTs, round-trip models,
liveness verdicts, and recovery messages to them.

One object over the node's view, links, failure detector and transport, so that the outbox and the
recovery (``datapath``) see one narrow interface (``datapath.recovery.Network``) instead of the
components behind it. No decisions of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.daemon.swarm.liveness import Liveness
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.daemon.timeouts import RoundTripModel
from gwtfp2p.daemon.wire import Recovery, encode_recovery
from gwtfp2p.transport import LinkEmulator, TransportError

logger = logging.getLogger(__name__)


class MessageSender(Protocol):
    link: LinkEmulator | None

    async def send_flow(self, peer: str, payload: bytes, *, timeout_s: float) -> None: ...


class SwarmDirectory:
    def __init__(self, *, view: SwarmView, links: LinkTable, liveness: Liveness, transport: MessageSender,
                 own_compute_s: Callable[[], float], activation_bytes: int, message_timeout_s: float) -> None:
        self.view = view
        self.links = links
        self.liveness = liveness
        self.transport = transport
        self.own_compute_s = own_compute_s
        self.activation_bytes = activation_bytes
        self.message_timeout_s = message_timeout_s

    def is_dead(self, peer: str) -> bool:
        return self.liveness.is_dead(peer)

    async def alive(self, peer: str) -> bool:
        return await self.liveness.alive(peer)

    def suspect(self, peer: str) -> None:
        self.liveness.suspect(peer)

    def exclude(self, peer: str, reason: str) -> object:
        return self.liveness.exclude(peer, reason)

    def candidates(self, stages: set[int]) -> list[str]:
        """Live peers of the run serving one of ``stages``."""
        return sorted(p for p, r in self.view.records.items() if r.stage in stages and not self.is_dead(p))

    def rtt(self, peer: str) -> float | None:
        return self.links.rtt(peer)

    def round_trip_model(self, peer: str, hops: int, queue_depth: int) -> RoundTripModel:
        """What an output sent to ``peer`` should need until its gradient is back (``timeouts``)."""
        rtt = self.links.rtt(peer) or 0.0
        link_s = rtt / 2 + self.activation_bytes / self.links.bandwidth(peer)
        if self.transport.link is not None:
            link_s += self.transport.link.delay_s(peer, self.activation_bytes)
        record = self.view.records.get(peer)
        compute = record.compute_s if record is not None and record.compute_s > 0 else self.own_compute_s()
        return RoundTripModel(hops, link_s, compute, queue_depth)

    async def send_recovery(self, peer: str, message: Recovery) -> bool:
        try:
            await self.transport.send_flow(peer, encode_recovery(message), timeout_s=self.message_timeout_s)
            return True
        except TransportError as e:
            logger.debug("recovery message to %s lost: %s", peer, e)
            self.suspect(peer)
            return False
