"""``--stage auto``: the stage a joining relay serves, chosen on the swarm's flow as the DHT shows it.

The joiner pings every node of the run, builds the flow instance from the records (measured
compute times and links) and asks the flow placement for the stage that raises the swarm's flow
the most: a stage no relay serves first, then the bottleneck.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gwtfp2p.config import ConfigError
from gwtfp2p.daemon.swarm_instance import instance_from_records, spec_activation_bytes
from gwtfp2p.dht import NodeRecord
from gwtfp2p.flow.instance import adjacent_stages
from gwtfp2p.flow.placement import choose_stage
from gwtfp2p.transport import TransportError

if TYPE_CHECKING:
    from gwtfp2p.daemon.node import Node

PING_TIMEOUT_S = 3.0


async def _ping_all(node: Node) -> None:
    assert node.transport is not None and node.view is not None
    peers = list(node.view.records)

    async def ping(peer: str) -> None:
        try:
            result = await node.transport.ping(peer, timeout_s=PING_TIMEOUT_S)
        except TransportError:
            return
        node.links.observe_rtt(peer, result.rtt_s)

    await asyncio.gather(*(ping(p) for p in peers))


def _choose(node: Node, records: dict[str, NodeRecord]) -> tuple[int, str]:
    """The placement's stage for this node among ``records`` (edge costs from this node's pings)."""
    spec = node.spec
    assert spec is not None
    instance = instance_from_records(spec, records, node.config.default_bandwidth_bytes_per_s)
    relays = [r.compute_s for r in records.values() if r.role == "relay" and r.compute_s > 0]
    compute_s = sum(relays) / len(relays) if relays else 0.0  # a stage's cost before we measure ours
    size = spec_activation_bytes(spec)

    def edge_costs_for(stage: int) -> dict[str, float]:
        costs = {}
        for peer, record in records.items():
            if record.stage <= spec.n_stages and adjacent_stages(stage, record.stage, spec.n_stages):
                cost = node.links.edge_cost(peer, compute_s, record.compute_s, size)
                if cost is not None:
                    costs[peer] = cost
        return costs

    placement = choose_stage(instance, node.peer_id, node.config.relay_capacity, edge_costs_for, compute_s)
    return placement.stage, placement.reason


async def pick_stage(node: Node, requested: int | None) -> tuple[int, str]:
    """``--stage K`` as given (checked against the run), or the placement's choice for ``auto``."""
    spec = node.spec
    assert spec is not None and node.view is not None
    if requested is not None:
        if requested > spec.n_stages:
            raise ConfigError(f"--stage: the run has stages 1..{spec.n_stages}, got {requested}")
        return requested, "--stage"
    await _ping_all(node)
    return _choose(node, dict(node.view.records))
