"""Global checks of a set of FlowNodes: the routed units and the protocol's invariants.

Only tests, the message bus and the simulator use this module: it reads every node's tables
at once (a global view no FlowNode has). A unit is routed when the chain of edge units from a
data holder's out-unit reaches a data holder's sink in-unit through one relay per stage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gwtfp2p.flow.evaluate import Path
from gwtfp2p.flow.node import FlowNode


@dataclass
class Snapshot:
    """Complete paths, and any invariant violations found while following the chains."""

    paths: list[Path] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)


def follow_chains(nodes: Mapping[str, FlowNode], n_stages: int) -> Snapshot:
    """Follow every data holder's out-units to the end of their chain."""
    snap = Snapshot()
    for dh_id in sorted(i for i, n in nodes.items() if n.stage == 0):
        for out in sorted(nodes[dh_id].core.outs.values(), key=lambda o: o.edge_id):
            if out.confirmed and not out.building:
                _follow(nodes, n_stages, dh_id, out.edge_id, out.next, snap)
    return snap


def _follow(nodes: Mapping[str, FlowNode], n_stages: int, dh_id: str, edge: str, nxt: str,
            snap: Snapshot) -> None:
    path = [dh_id]
    for hop in range(1, n_stages + 2):
        node = nodes.get(nxt)
        unit = node.core.ins.get(edge) if node is not None else None
        if unit is None:
            return
        path.append(nxt)
        if node.stage == 0:
            if hop != n_stages + 1:
                snap.violations.append(f"chain {path} reaches a data holder after {hop} hops")
            elif unit.sink != node.node_id or nxt != dh_id:
                snap.violations.append(f"chain {path} ends at {nxt}, not its own data holder {dh_id}")
            else:
                snap.paths.append(tuple(path))
            return
        if node.stage != hop:
            snap.violations.append(f"chain {path}: {nxt} is stage {node.stage}, expected {hop}")
            return
        out = node.core.outs.get(unit.out_id) if unit.out_id else None
        if out is None or not out.confirmed:
            return
        edge, nxt = out.edge_id, out.next


def check_invariants(nodes: Mapping[str, FlowNode], n_stages: int,
                     lost_signalled: Mapping[str, Iterable[str]] | None = None) -> Snapshot:
    """Capacities, supplies, single ownership of edge units, and no unit through a lost node.

    ``lost_signalled`` maps each live node to the lost nodes whose loss it was told about.
    """
    snap = follow_chains(nodes, n_stages)
    owners_in: Counter[str] = Counter()
    owners_out: Counter[str] = Counter()
    for node_id, node in nodes.items():
        c = node.core
        if node.stage > 0 and len(c.ins) + c.reserved > c.capacity:
            snap.violations.append(f"{node_id} holds {len(c.ins)}+{c.reserved} units, capacity {c.capacity}")
        owners_in.update(c.ins.keys())
        owners_out.update(c.outs.keys())
        for lost in (lost_signalled or {}).get(node_id, ()):
            if any(u.prev == lost for u in c.ins.values()) or any(o.next == lost for o in c.outs.values()):
                snap.violations.append(f"{node_id} still routes through {lost} after its loss was signalled")
    per_holder = Counter(p[0] for p in snap.paths)
    for dh_id, units in per_holder.items():
        if units > nodes[dh_id].core.supply:
            snap.violations.append(f"{dh_id} routes {units} units, supply {nodes[dh_id].core.supply}")
    snap.violations += [f"edge unit {e} held by {k} nodes" for e, k in owners_in.items() if k > 1]
    snap.violations += [f"edge unit {e} owned by {k} nodes" for e, k in owners_out.items() if k > 1]
    return snap
