"""The swarm as ``gwtf status`` shows it: read in client mode from the DHT, summarized as plain data.

``read_snapshot`` reads the current run and every node record through an open DHT (``read_swarm``
joins the DHT as a client for one read); ``summarize`` turns them into one JSON-able dict: the run,
its stages (replicas, capacity, compute times, hashes, whether the replicas are in sync), every
node, the routing (who sends to whom, how many units, the link RTT and the edge cost), iteration,
loss, throughput, and the routing's cost against the oracle on the same measured costs.
``stage_sync`` compares replicas' state hashes at equal iterations. Rendering is the CLI's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.swarm.instance import instance_from_records, routing_cost
from gwtfp2p.dht import DHTTimeout, NodeRecord, SwarmDHT
from gwtfp2p.flow.instance import FlowInstance
from gwtfp2p.flow.oracle import solve
from gwtfp2p.ids import short_peer_id

RELAYED_MADDR_PART = "/p2p-circuit"  # a libp2p address reached through a relay (the node is behind a NAT)


@dataclass(frozen=True)
class SwarmSnapshot:
    run_id: str
    spec: RunSpec
    records: dict[str, NodeRecord]


class NoRunError(RuntimeError):
    """The DHT holds no run (yet)."""


async def read_snapshot(dht: SwarmDHT, timeout_s: float = 10.0) -> SwarmSnapshot:
    """The current run and its node records, read through ``dht`` within ``timeout_s`` in all."""
    async def read() -> SwarmSnapshot:
        record = await dht.read_current_run(timeout_s=timeout_s)
        if record is None:
            raise NoRunError("the swarm has no run yet (start a data holder with gwtf join --role data)")
        nodes = await dht.read_nodes(record.run_id, timeout_s=timeout_s)
        return SwarmSnapshot(record.run_id, record.to_spec(), nodes)

    try:
        return await asyncio.wait_for(read(), timeout_s)
    except asyncio.TimeoutError as e:
        raise DHTTimeout(f"reading the swarm from the DHT took over {timeout_s:.1f} s") from e


async def read_swarm(initial_peers: tuple[str, ...], timeout_s: float = 30.0) -> SwarmSnapshot:
    """Join the DHT as a client (no records of its own), read one snapshot, leave."""
    dht = await SwarmDHT.create(initial_peers=initial_peers, client_mode=True, startup_timeout_s=timeout_s)
    try:
        return await read_snapshot(dht, timeout_s)
    finally:
        await dht.shutdown()


# -- replicas in sync ----------------------------------------------------------------------------

def hashes_of(record: NodeRecord) -> dict[int, str]:
    """Iteration → state hash after that iteration's step, as the record reports them. Records of
    daemons without ``recent_hashes`` give their one hash, of the step before their iteration."""
    if record.recent_hashes:
        return dict(record.recent_hashes)
    if record.weight_hash and record.iteration >= 1:
        return {record.iteration - 1: record.weight_hash}
    return {}


def _compare(a: dict[int, str], b: dict[int, str]) -> tuple[str, int | None, int | None]:
    """("agree" | "differ" | "none", iteration, agreed): at their latest common iteration. For "differ":
    the first iteration of the run of differing hashes that ends there, and the last common iteration
    before it where they agreed (None if none is known): the divergence happened in between."""
    common = sorted(a.keys() & b.keys())
    if not common:
        return "none", None, None
    if a[common[-1]] == b[common[-1]]:
        return "agree", common[-1], common[-1]
    first, agreed = common[-1], None
    for t in reversed(common):
        if a[t] == b[t]:
            agreed = t
            break
        first = t
    return "differ", first, agreed


def _verdict(peer: str, hashes: dict[str, dict[int, str]], newest: int) -> dict[str, Any]:
    own = hashes[peer]
    latest = max(own)
    agree, differ = [], {}
    for other in hashes:
        if other != peer:
            how, t, agreed = _compare(own, hashes[other])
            if how == "agree":
                agree.append(other)
            elif how == "differ":
                differ[other] = (t, agreed)
    verdict: dict[str, Any] = {"status": "in_sync", "iteration": latest, "behind": newest - latest}
    leaders = [q for q, h in hashes.items() if max(h) == newest and q != peer]
    if differ and len(agree) + 1 <= len(differ):  # not backed by a majority of the replicas it compared with
        t = min(first for first, _ in differ.values())
        agreed = [a for first, a in differ.values() if first == t and a is not None]
        others = {q: hashes[q].get(t, hashes[q][differ[q][0]]) for q in sorted(differ)}
        verdict.update(status="diverged", iteration_diverged=t, last_agreed=max(agreed, default=None), hash=own[t],
                       diverged_from=others)
    elif latest < newest and not any(own.keys() & hashes[q].keys() for q in leaders):
        verdict["status"] = "lagging"  # too far behind the stage's leaders to compare with them
    elif not agree and not differ and len(hashes) > 1:
        verdict["status"] = "unverified"  # shares no iteration with any other replica
    return verdict


def stage_sync(records: Iterable[NodeRecord]) -> dict[str, Any]:
    """Replicas of one stage compared at equal iterations: each one ``in_sync``, ``diverged`` (its hash
    differs from most replicas it shares an iteration with; a tie marks both), ``lagging`` (behind the
    stage's most advanced replicas with no iteration in common), ``unverified`` (no iteration in common
    with any replica) or ``no_hash``/``leaving`` (not compared). The stage's ``state`` is the worst one."""
    records = list(records)
    hashes = {r.peer_id: hashes_of(r) for r in records if r.state != "leaving"}
    hashes = {p: h for p, h in hashes.items() if h}
    newest = max((max(h) for h in hashes.values()), default=None)
    replicas: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.peer_id in hashes and newest is not None:
            replicas[r.peer_id] = _verdict(r.peer_id, hashes, newest)
        else:
            replicas[r.peer_id] = {"status": "leaving" if r.state == "leaving" else "no_hash", "iteration": None,
                                   "behind": None}
    statuses = {v["status"] for v in replicas.values()}
    state = next((s for s in ("diverged", "lagging", "unverified") if s in statuses), "in_sync")
    return {"state": state, "newest_iteration": newest, "replicas": replicas}


def sync_problems(stages: list[dict[str, Any]]) -> list[str]:
    """One line per replica that is not in sync: which replica diverged from which at what iteration."""
    lines = []
    for stage in stages:
        sync, k = stage["sync"], stage["stage"]
        for peer, v in sorted(sync["replicas"].items()):
            if v["status"] == "diverged":
                since = f" (still agreed at iteration {v['last_agreed']})" if v["last_agreed"] is not None else ""
                lines.append(f"stage {k}: replica {short_peer_id(peer)} diverged from {_others(v['diverged_from'])} at "
                             f"iteration {v['iteration_diverged']}{since}: its hash {v['hash']}")
            elif v["status"] == "lagging":
                lines.append(f"stage {k}: replica {short_peer_id(peer)} lags: last hash at iteration {v['iteration']}, "
                             f"{v['behind']} behind the stage, no iteration in common to compare")
            elif v["status"] == "unverified":
                lines.append(f"stage {k}: replica {short_peer_id(peer)} at iteration {v['iteration']} shares no "
                             f"iteration with the other replicas: not verified")
    return lines


def _others(hashes: dict[str, str], listed: int = 3) -> str:
    """``…a, …b (hash h)``: the replicas grouped by the hash they have, a few named per group."""
    groups: dict[str, list[str]] = {}
    for peer, h in hashes.items():
        groups.setdefault(h, []).append(short_peer_id(peer))
    parts = []
    for h, peers in sorted(groups.items(), key=lambda g: -len(g[1])):
        more = f" and {len(peers) - listed} more" if len(peers) > listed else ""
        parts.append(f"{', '.join(peers[:listed])}{more} (hash {h})")
    return "; ".join(parts)


# -- the summary ---------------------------------------------------------------------------------

def _node(record: NodeRecord, sync: dict[str, Any]) -> dict[str, Any]:
    hashes = hashes_of(record)
    return {"peer_id": record.peer_id, "role": record.role, "stage": record.stage, "state": record.state,
            "iteration": record.iteration, "capacity": record.capacity, "compute_ms": record.compute_s * 1000,
            "location": record.location, "hash": record.weight_hash, "loss": record.loss,
            "tokens_per_s": record.tokens_per_s, "units_out": sum(r.units for r in record.routing),
            "links_rtt_ms": {p: link.rtt_s * 1000 for p, link in sorted(record.links.items())},
            "hash_iteration": max(hashes, default=None), "recent_hashes": [list(e) for e in sorted(hashes.items())],
            "sync": sync.get("status", "outside_run"),
            "relayed": any(RELAYED_MADDR_PART in m for m in record.maddrs), "updated_at": record.updated_at,
            "excluded": [{"peer": e.peer, "reason": e.reason} for e in record.excluded]}


def _flow(instance: FlowInstance, records: dict[str, NodeRecord]) -> dict[str, Any]:
    units, cost = routing_cost(instance, records)
    result = {"units": units, "cost_s": cost, "oracle_units": None, "oracle_cost_s": None}
    if instance.data_holders and any(not n.is_data_holder for n in instance.nodes):
        quality = solve(instance).quality
        result.update(oracle_units=quality.flow_value, oracle_cost_s=quality.total_cost)
    return result


def _routing(records: list[NodeRecord], instance: FlowInstance) -> list[dict[str, Any]]:
    return [{"from": r.peer_id, "to": route.next_peer, "sink": route.sink, "units": route.units,
             "rtt_ms": r.links[route.next_peer].rtt_s * 1000 if route.next_peer in r.links else None,
             "cost_s": instance.cost(r.peer_id, route.next_peer)}
            for r in records for route in r.routing]


def summarize(snapshot: SwarmSnapshot) -> dict[str, Any]:
    records = [snapshot.records[p] for p in sorted(snapshot.records)]
    instance = instance_from_records(snapshot.spec, snapshot.records)
    holders = [r for r in records if r.role == "data" and r.state != "leaving"]
    stages, verdicts = [], {}
    for k in range(0, snapshot.spec.n_stages + 1):
        replicas = [r for r in records if r.stage == k]
        sync = stage_sync(replicas)
        verdicts.update(sync["replicas"])
        stages.append({"stage": k, "replicas": [r.peer_id for r in replicas],
                       "capacity": sum(r.capacity for r in replicas),
                       "compute_ms": [r.compute_s * 1000 for r in replicas],
                       "hashes": {r.peer_id: r.weight_hash for r in replicas},
                       "in_sync": sync["state"] == "in_sync", "sync": sync})
    lead = max(holders, key=lambda r: r.iteration, default=None)
    return {"run_id": snapshot.run_id, "spec": asdict(snapshot.spec),
            "iteration": lead.iteration if lead else 0, "loss": lead.loss if lead else None,
            "tokens_per_s": lead.tokens_per_s if lead else 0.0,
            "replicas_in_sync": all(s["in_sync"] for s in stages), "sync_problems": sync_problems(stages),
            "stages": stages, "unserved_stages": [s["stage"] for s in stages if s["stage"] > 0 and not s["replicas"]],
            "nodes": [_node(r, verdicts.get(r.peer_id, {})) for r in records],
            "excluded": [{"peer": e.peer, "by": r.peer_id, "reason": e.reason} for r in records for e in r.excluded],
            "routing": _routing(records, instance), "flow": _flow(instance, snapshot.records)}
