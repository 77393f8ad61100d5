"""``--stage auto``: the stage a joining relay serves, chosen on the swarm's flow as the DHT shows it.

The joiner pings every node of the run (measuring its links to them), builds the flow instance from
the records (their measured compute times and links) and asks the flow placement (``flow.placement``,
pure) for the stage that raises the swarm's flow the most: a stage no relay serves first, then the
bottleneck. ``--stage K`` is taken as given, checked against the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from gwtfp2p.config import ConfigError, RunSpec
from gwtfp2p.daemon.swarm.instance import instance_from_records, spec_activation_bytes
from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.daemon.swarm.liveness import Liveness
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.dht import NodeRecord
from gwtfp2p.flow.instance import adjacent_stages


def choose(spec: RunSpec, self_id: str, records: Mapping[str, NodeRecord], links: LinkTable, capacity: int,
           default_bandwidth_bytes_per_s: float) -> tuple[int, str]:
    """The placement's stage for a node among ``records`` (edge costs from its own link figures)."""
    instance = instance_from_records(spec, records, default_bandwidth_bytes_per_s)
    relays = [r.compute_s for r in records.values() if r.role == "relay" and r.compute_s > 0]
    compute_s = sum(relays) / len(relays) if relays else 0.0  # a stage's cost before we measure ours
    size = spec_activation_bytes(spec)

    def edge_costs_for(stage: int) -> dict[str, float]:
        costs = {}
        for peer, record in records.items():
            if record.stage <= spec.n_stages and adjacent_stages(stage, record.stage, spec.n_stages):
                cost = links.edge_cost(peer, compute_s, record.compute_s, size)
                if cost is not None:
                    costs[peer] = cost
        return costs

    from gwtfp2p.flow.placement import choose_stage  # the oracle's solvers: only a --stage auto node loads them

    placement = choose_stage(instance, self_id, capacity, edge_costs_for, compute_s)
    return placement.stage, placement.reason


async def pick_stage(requested: int | None, spec: RunSpec, self_id: str, *, view: SwarmView, liveness: Liveness,
                     links: LinkTable, capacity: int, default_bandwidth_bytes_per_s: float) -> tuple[int, str]:
    """``--stage K`` as given (checked against the run), or the placement's choice for ``auto``."""
    if requested is not None:
        if requested > spec.n_stages:
            raise ConfigError(f"--stage: the run has stages 1..{spec.n_stages}, got {requested}")
        return requested, "--stage"
    await asyncio.gather(*(liveness.ping(peer) for peer in list(view.records)))
    return choose(spec, self_id, dict(view.records), links, capacity, default_bandwidth_bytes_per_s)
