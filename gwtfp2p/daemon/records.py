"""What a node says about itself: its DHT record and its periodic ``progress`` event.

The record (role, stage, state, capacity, measured compute and links, routing, state hash, loss)
is built fresh for every heartbeat from the node's components and bounded to the record's limits
(``MAX_LINKS`` links, ``MAX_ROUTES`` routing lines), so it always encodes under the DHT cap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gwtfp2p.dht import MAX_LINKS, MAX_ROUTES, LinkStats, NodeRecord, RouteSummary

if TYPE_CHECKING:
    from gwtfp2p.daemon.node import Node

MAX_RTT_S = 600.0


def own_record(node: Node) -> NodeRecord:
    c = node.config
    links = {}
    for peer in node.links.peers()[:MAX_LINKS]:
        rtt = min(node.links.rtt(peer) or 0.0, MAX_RTT_S)
        links[peer] = LinkStats(rtt_s=rtt, bandwidth_bytes_per_s=float(node.links.bandwidth(peer)))
    routes = node.routing.summary()[:MAX_ROUTES] if node.routing is not None else []
    spec = node.spec
    capacity = spec.microbatches_per_dh if c.is_data_holder and spec is not None else c.relay_capacity
    state_hash = node.aggregator.last_hash if node.aggregator is not None else ""
    loss = node.loss if node.loss is not None and abs(node.loss) < 1e6 else None
    return NodeRecord(
        run_id=node.run_id, peer_id=node.peer_id, role="data" if c.is_data_holder else "relay", stage=node.stage,
        state=node.state, capacity=capacity, compute_s=min(node.compute_s(), 86_400.0), maddrs=tuple(node.maddrs),
        iteration=node.gate.iteration, location=_location(node), links=links,
        routing=tuple(RouteSummary(next_peer=n, sink=s, units=u) for n, s, u in routes),
        weight_hash=state_hash, loss=loss, tokens_per_s=max(0.0, node.tokens_per_s))


def _location(node: Node) -> str:
    link = node.transport.link if node.transport is not None else None
    return link.own_location if link is not None else ""


def progress_fields(node: Node) -> dict:
    data = node.data
    routes = node.routing.summary() if node.routing is not None else []
    fields = {"role": node.config.role, "stage": node.stage, "iteration": node.gate.iteration,
              "units": sum(n for _, _, n in routes), "peers": len(node.view.records) if node.view else 0,
              "compute_ms": round(node.compute_s() * 1000, 2), "loss": node.loss,
              "tokens_per_s": node.tokens_per_s}
    if hasattr(data, "in_flight"):
        fields.update(forwards=data.forwards, backwards=data.backwards, in_flight=data.in_flight)
    return fields
