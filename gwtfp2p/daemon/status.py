"""The swarm as ``gwtf status`` shows it: read in client mode from the DHT, summarized as plain data.

``read_swarm`` joins the DHT as a client (no records of its own), reads the current run and every
node record; ``summarize`` turns them into one JSON-able dict: the run, its stages (replicas,
capacity, compute times, hashes in sync), every node, the routing (who sends to whom, how many
units, the link RTT), iteration, loss, throughput, and the routing's cost against the oracle on
the same measured costs. Rendering is the CLI's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.swarm_instance import instance_from_records, routing_cost
from gwtfp2p.dht import NodeRecord, SwarmDHT
from gwtfp2p.flow.oracle import solve


@dataclass(frozen=True)
class SwarmSnapshot:
    run_id: str
    spec: RunSpec
    records: dict[str, NodeRecord]


class NoRunError(RuntimeError):
    """The DHT holds no run (yet)."""


async def read_swarm(initial_peers: tuple[str, ...], timeout_s: float = 30.0) -> SwarmSnapshot:
    dht = await SwarmDHT.create(initial_peers=initial_peers, client_mode=True, startup_timeout_s=timeout_s)
    try:
        record = await dht.read_current_run()
        if record is None:
            raise NoRunError("the swarm has no run yet (start a data holder with gwtf join --role data)")
        nodes = await dht.read_nodes(record.run_id)
        return SwarmSnapshot(record.run_id, record.to_spec(), nodes)
    finally:
        await dht.shutdown()


def _hashes_in_sync(records: list[NodeRecord]) -> bool:
    """Replicas at the most common iteration agree on their state hash."""
    hashed = [r for r in records if r.weight_hash and r.state != "leaving"]
    if len(hashed) < 2:
        return True
    iteration = Counter(r.iteration for r in hashed).most_common(1)[0][0]
    return len({r.weight_hash for r in hashed if r.iteration == iteration}) == 1


def _node(record: NodeRecord) -> dict[str, Any]:
    return {"peer_id": record.peer_id, "role": record.role, "stage": record.stage, "state": record.state,
            "iteration": record.iteration, "capacity": record.capacity, "compute_ms": record.compute_s * 1000,
            "location": record.location, "hash": record.weight_hash, "loss": record.loss,
            "tokens_per_s": record.tokens_per_s, "units_out": sum(r.units for r in record.routing),
            "links_rtt_ms": {p: link.rtt_s * 1000 for p, link in sorted(record.links.items())}}


def _flow(snapshot: SwarmSnapshot) -> dict[str, Any]:
    instance = instance_from_records(snapshot.spec, snapshot.records)
    units, cost = routing_cost(instance, snapshot.records)
    result = {"units": units, "cost_s": cost, "oracle_units": None, "oracle_cost_s": None}
    if instance.data_holders and any(not n.is_data_holder for n in instance.nodes):
        quality = solve(instance).quality
        result.update(oracle_units=quality.flow_value, oracle_cost_s=quality.total_cost)
    return result


def summarize(snapshot: SwarmSnapshot) -> dict[str, Any]:
    records = [snapshot.records[p] for p in sorted(snapshot.records)]
    holders = [r for r in records if r.role == "data" and r.state != "leaving"]
    stages = []
    for k in range(0, snapshot.spec.n_stages + 1):
        replicas = [r for r in records if r.stage == k]
        stages.append({"stage": k, "replicas": [r.peer_id for r in replicas],
                       "capacity": sum(r.capacity for r in replicas),
                       "compute_ms": [r.compute_s * 1000 for r in replicas],
                       "hashes": {r.peer_id: r.weight_hash for r in replicas},
                       "in_sync": _hashes_in_sync(replicas)})
    routing = [{"from": r.peer_id, "to": route.next_peer, "sink": route.sink, "units": route.units,
                "rtt_ms": r.links[route.next_peer].rtt_s * 1000 if route.next_peer in r.links else None}
               for r in records for route in r.routing]
    lead = max(holders, key=lambda r: r.iteration, default=None)
    return {"run_id": snapshot.run_id, "spec": asdict(snapshot.spec),
            "iteration": lead.iteration if lead else 0, "loss": lead.loss if lead else None,
            "tokens_per_s": lead.tokens_per_s if lead else 0.0,
            "replicas_in_sync": all(s["in_sync"] for s in stages), "stages": stages,
            "unserved_stages": [s["stage"] for s in stages if s["stage"] > 0 and not s["replicas"]],
            "nodes": [_node(r) for r in records], "routing": routing, "flow": _flow(snapshot)}
