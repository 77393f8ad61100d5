"""The swarm as a flow instance, built from DHT node records (measured costs), and its routing cost.

Used by ``--stage auto`` (placement on the swarm's flow), by ``gwtf status`` and by the tests that
compare the achieved routing with the oracle on the same measured costs. An edge's cost is the
paper's ``d(i,j)`` from both nodes' measured compute times and the RTT/bandwidth the upstream
node measured (or else the downstream one); pairs nobody measured have no edge.
"""

from __future__ import annotations

from collections.abc import Mapping

from gwtfp2p.config import RunSpec, encoded_bytes
from gwtfp2p.daemon.swarm.links import activation_bytes
from gwtfp2p.dht import NodeRecord
from gwtfp2p.flow.costs import edge_cost_s
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, adjacent_stages, edge_key
from gwtfp2p.model.presets import get_preset


def spec_activation_bytes(spec: RunSpec) -> int:
    """One microbatch's activations on the wire, in the run's forward codec (float32 values before it)."""
    hidden = get_preset(spec.model_family, spec.model_preset).hidden
    return encoded_bytes(spec.forward_codec, activation_bytes(spec.microbatch_size, spec.seq_len, hidden, 1), 4)


def node_spec(record: NodeRecord, spec: RunSpec) -> NodeSpec:
    if record.role == "data":
        return NodeSpec(record.peer_id, 0, supply=spec.microbatches_per_dh, compute_s=record.compute_s,
                        location=record.location)
    return NodeSpec(record.peer_id, record.stage, capacity=record.capacity, compute_s=record.compute_s,
                    location=record.location)


def measured_cost(a: NodeRecord, b: NodeRecord, size_bytes: int, default_bandwidth: float) -> float | None:
    """d(a, b) from the records, with a's link figures to b (else b's to a); None if unmeasured."""
    link = a.links.get(b.peer_id) or b.links.get(a.peer_id)
    if link is None:
        return None
    bandwidth = link.bandwidth_bytes_per_s or default_bandwidth
    return edge_cost_s(a.compute_s, b.compute_s, link.rtt_s / 2, link.rtt_s / 2, bandwidth, bandwidth, size_bytes)


def instance_from_records(spec: RunSpec, records: Mapping[str, NodeRecord],
                          default_bandwidth: float = 1e9) -> FlowInstance:
    """Nodes (within the run's stages, not leaving) and measured edge costs of the swarm."""
    live = [r for _, r in sorted(records.items()) if r.state != "leaving" and r.stage <= spec.n_stages]
    size = spec_activation_bytes(spec)
    costs: dict[tuple[str, str], float] = {}
    for i, a in enumerate(live):
        for b in live[i + 1:]:
            if not adjacent_stages(a.stage, b.stage, spec.n_stages):
                continue
            upstream, downstream = (a, b) if (a.stage + 1) % (spec.n_stages + 1) == b.stage else (b, a)
            cost = measured_cost(upstream, downstream, size, default_bandwidth)
            if cost is not None:
                costs[edge_key(a.peer_id, b.peer_id)] = cost
    return FlowInstance(spec.n_stages, tuple(node_spec(r, spec) for r in live), costs)


def routing_edges(records: Mapping[str, NodeRecord]) -> dict[tuple[str, str], int]:
    """Units on each directed edge (node → next), from every node's routing summary."""
    edges: dict[tuple[str, str], int] = {}
    for peer, record in records.items():
        for route in record.routing:
            edges[(peer, route.next_peer)] = edges.get((peer, route.next_peer), 0) + route.units
    return edges


def routing_cost(instance: FlowInstance, records: Mapping[str, NodeRecord]) -> tuple[int, float]:
    """(units leaving the data holders, total cost Σ units × edge cost) of the achieved routing."""
    flow, total = 0, 0.0
    holders = {n.node_id for n in instance.data_holders}
    for (a, b), units in routing_edges(records).items():
        cost = instance.cost(a, b)
        if cost is None:
            continue
        total += units * cost
        if a in holders:
            flow += units
    return flow, total
