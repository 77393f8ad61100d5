"""Dialing a peer at the addresses its DHT record publishes: the failure detector's second chance.

p2pd dials a peer at the addresses it learned over its own connections (identify, the DHT), and a node
behind a NAT announces none it can be dialed at there: it is reached only through the relay circuits
its record lists (``lifecycle/network.py``). A replica that sends to such a peer before it introduced
it (``neighbours``) fails to dial it; ``Liveness`` asks ``RecordDialer`` to connect at the record's
addresses before it pings again, so the peer is not declared dead for our own lack of a route.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.transport import TransportError

logger = logging.getLogger(__name__)


class Connector(Protocol):
    async def connect(self, peer: str, maddrs: Sequence[str], *, timeout_s: float) -> None: ...


class RecordDialer:
    """``redial(peer)``: a connection to ``peer`` at the addresses of its record in ``view``, if any."""

    def __init__(self, view: SwarmView, connector: Connector) -> None:
        self.view = view
        self.connector = connector

    async def redial(self, peer: str, *, timeout_s: float) -> bool:
        record = self.view.records.get(peer) or self.view.seen.get(peer)  # an expired record's addresses too
        if record is None or not record.maddrs:
            return False
        try:
            await self.connector.connect(peer, record.maddrs, timeout_s=timeout_s)
        except TransportError as e:
            logger.debug("dial of %s at %s failed: %s", peer, list(record.maddrs), e)
            return False
        return True
