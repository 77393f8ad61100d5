"""Joining the DHT again after an outage: dial known peers and put them back in the routing table.

hivemind drops peers that stop answering from its routing table; a node whose network was down for
a while may find it empty when the network returns, and a DHT with no peers finds no records. The
node's ``swarm/outage.py`` then calls ``SwarmDHT.rejoin`` with its initial peers and the swarm's
last known addresses: ``rejoin_peers`` runs inside the DHT process, dials each (p2pd), pings its DHT
(which adds it to the routing table again) and returns how many answered. Relayed addresses are
skipped: those peers are DHT clients, and they dial out to us.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr


def dialable(maddrs: Sequence[str]) -> list[tuple[str, str]]:
    """(peer id, address without /p2p/) of each direct ``.../p2p/<id>`` address, once per address."""
    out: dict[str, tuple[str, str]] = {}
    for maddr in maddrs:
        if "/p2p-circuit" in maddr or "/p2p/" not in maddr:
            continue
        base, peer = maddr.rsplit("/p2p/", 1)
        out.setdefault(maddr, (peer, base))
    return list(out.values())


async def rejoin_peers(_dht: Any, node: Any, maddrs: list[str], dial_timeout_s: float) -> int:
    """Inside the DHT process: dial and ping each address's peer; the number of peers that answered."""
    async def one(peer_id: str, base: str) -> bool:
        try:
            peer = PeerID.from_base58(peer_id)
            address = Multiaddr(base)
        except Exception:
            return False
        with contextlib.suppress(Exception):
            await asyncio.wait_for(node.p2p._client.connect(peer, [address]), dial_timeout_s)  # no public connect()
        try:
            return await asyncio.wait_for(node.protocol.call_ping(peer), dial_timeout_s) is not None
        except Exception:
            return False

    results = await asyncio.gather(*(one(peer, base) for peer, base in dialable(maddrs)))
    return sum(results)
