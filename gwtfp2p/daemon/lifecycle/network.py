"""A node's way onto the network: its identity key, its reachability, its DHT, its peers' versions.

``open_network`` runs first in ``lifecycle/node.py``: the key file (``--identity``, else the user's
default key, ``dht/identity_file.py``), the reachability check on the port the node will listen on
(``swarm/reachability.py``: it decides p2pd's relay options and what to announce), the DHT itself
(forked before any thread), then ``hello`` to the initial peers (``preflight.check_versions``).
``Network.record_maddrs`` is what the node's DHT record tells peers to dial: through its relays
first when it is behind a NAT.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from gwtfp2p.daemon.config import NodeConfig
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.lifecycle.preflight import check_versions
from gwtfp2p.daemon.swarm.reachability import Reachability, check_reachability, fixed_port, needs_check
from gwtfp2p.dht import SwarmDHT
from gwtfp2p.dht.identity_file import IdentityFile, open_default_identity, write_new_key
from gwtfp2p.dht.records import MAX_MADDRS
from gwtfp2p.transport.maddrs import circuit_via

LOOPBACK_PREFIXES = ("/ip4/127.", "/ip6/::1/")


@dataclass
class Network:
    dht: SwarmDHT
    reach: Reachability
    identity: IdentityFile

    def record_maddrs(self, visible: list[str]) -> tuple[str, ...]:
        """The addresses our record publishes: relay circuits first for a relayed node, then p2pd's."""
        if self.reach.verdict != "relayed":
            return tuple(visible[:MAX_MADDRS])
        circuits = [circuit_via(relay, self.dht.peer_id) for relay in self.reach.relays]
        direct = [m for m in visible if not m.startswith(LOOPBACK_PREFIXES)]
        return tuple(dict.fromkeys(circuits + direct))[:MAX_MADDRS]


def _identity(config: NodeConfig) -> IdentityFile:
    """``--identity FILE`` (created 0600 if missing), else the user's default key (``identity_file``)."""
    path = config.network.identity_path
    if not path:
        return open_default_identity()
    if not os.path.exists(path):
        write_new_key(Path(path))
    return IdentityFile(path, persistent=True)


async def open_network(config: NodeConfig, events: Events, stack: contextlib.AsyncExitStack) -> Network:
    """Identity, reachability, DHT and the initial peers' versions; each undone by ``stack``."""
    net, t = config.network, config.timings
    identity = _identity(config)
    stack.callback(identity.close)
    port = fixed_port(net.host, net.port) if needs_check(net) else net.port
    host_maddrs = (f"/ip4/{net.host}/tcp/{port}",)
    reach = await check_reachability(net, host_maddrs, port, t, events)
    dht = await SwarmDHT.create(initial_peers=net.initial_peers, host_maddrs=host_maddrs,
                                announce_maddrs=reach.announce, identity_path=identity.path,
                                startup_timeout_s=t.startup_timeout_s, relay=reach.relay_options(net),
                                check_identity_free=bool(net.identity_path),
                                verify_signatures=config.security.signatures)
    stack.push_async_callback(dht.shutdown)
    if net.initial_peers:
        await check_versions(await dht.replicate_p2p(), net.initial_peers, timeout_s=t.message_timeout_s)
    return Network(dht, reach, identity)
