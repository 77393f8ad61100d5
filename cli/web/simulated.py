"""A made-up swarm of any size as DHT node records, summarized like a real read (no DHT, no daemon).

``gwtf status --simulate N`` serves or draws it, so the page can be tried and measured (render time
with 100 nodes) without a swarm. Nodes sit in geo10 locations (RTTs from the packaged table),
the routing is the oracle's on the records' own measured costs, and each read advances one
iteration and every few reads a relay crashes and a newcomer joins its stage. A few nodes are
joining, leaving, relayed, one replica has diverged and one lags, so every mark shows. Seeded.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections import defaultdict
from typing import Any

from gwtfp2p.config import RunSpec
from gwtfp2p.daemon.status import SwarmSnapshot, summarize
from gwtfp2p.daemon.swarm.instance import instance_from_records
from gwtfp2p.dht.records import LinkStats, NodeRecord, RouteSummary, pick_recent_hashes, run_id_of
from gwtfp2p.flow.geo import geo10
from gwtfp2p.flow.oracle import solve

BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
CHURN_EVERY_READS = 10
LAG_ITERATIONS = 60  # beyond what two records' hash windows can bridge


def _stages_for(n_nodes: int) -> int:
    return 2 if n_nodes < 12 else 4 if n_nodes < 200 else 8


class SimulatedSwarm:
    """``summary()`` is one read of a swarm of ``n_nodes`` (two data holders from 50 to 150 nodes, else one)."""

    def __init__(self, n_nodes: int, seed: int = 0) -> None:
        if n_nodes < 3:
            raise ValueError(f"--simulate: a swarm needs at least 3 nodes (a data holder, 2 stages), got {n_nodes}")
        self.rng = random.Random(seed)
        self.geo = geo10()
        n_stages = _stages_for(n_nodes)
        n_holders = 2 if 50 <= n_nodes <= 150 else 1  # several: the oracle is an integer program, slow on big swarms
        self.spec = RunSpec(n_stages=n_stages, microbatches_per_dh=max(4, n_nodes // (4 * n_holders)), seed=seed)
        self.run_id = run_id_of(self.spec)
        self.iteration = 500
        self.reads = 0
        self.nodes: dict[str, dict[str, Any]] = {}
        for _ in range(n_holders):
            self._add(0, "online")
        for i in range(n_nodes - n_holders):
            self._add(1 + i % n_stages, "online")
        relays = sorted(p for p, n in self.nodes.items() if n["stage"] > 0)
        self.diverged, self.lagging, joining, leaving, relayed = self.rng.sample(relays, 5)
        self.nodes[joining]["state"] = "joining"
        self.nodes[leaving]["state"] = "leaving"
        self.nodes[relayed]["relayed"] = True
        self.diverged_at = self.iteration - 2

    def _peer_id(self) -> str:
        return "12D3KooW" + "".join(self.rng.choice(BASE58) for _ in range(44))

    def _add(self, stage: int, state: str) -> str:
        peer = self._peer_id()
        location = self.rng.choice(self.geo.locations)
        self.nodes[peer] = {"stage": stage, "state": state, "location": location, "relayed": False,
                            "capacity": self.rng.randint(1, 4), "compute_s": 0.05 * self.geo.compute_factor[location]}
        return peer

    def _hash(self, peer: str, stage: int, t: int) -> str:
        key = f"{stage}:{t}" + (f":{peer}" if peer == self.diverged and t >= self.diverged_at else "")
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def _record(self, peer: str, routes: list[RouteSummary]) -> NodeRecord:
        node, stage = self.nodes[peer], self.nodes[peer]["stage"]
        nxt = (stage + 1) % (self.spec.n_stages + 1)
        links = {}
        for other, o in sorted(self.nodes.items()):
            if o["stage"] == nxt and len(links) < 32:
                latency_s, bandwidth = self.geo.link(node["location"], o["location"])
                links[other] = LinkStats(rtt_s=2 * latency_s, bandwidth_bytes_per_s=bandwidth)
        last = self.iteration - (LAG_ITERATIONS if peer == self.lagging else 0)
        hashes = () if node["state"] == "joining" else pick_recent_hashes(
            [(t, self._hash(peer, stage, t)) for t in range(last - 39, last)])
        maddr = f"/ip4/203.0.113.{1 + len(peer) % 250}/tcp/31337/p2p/{peer}"
        if node["relayed"]:
            maddr = f"/ip4/198.51.100.7/tcp/31337/p2p/{self._peer_id()}/p2p-circuit/p2p/{peer}"
        loss = 5.5 * math.exp(-self.iteration / 400) + 0.05 * self.rng.random()
        return NodeRecord(
            run_id=self.run_id, peer_id=peer, role="data" if stage == 0 else "relay", stage=stage, state=node["state"],
            capacity=self.spec.microbatches_per_dh if stage == 0 else node["capacity"], compute_s=node["compute_s"],
            maddrs=(maddr,), iteration=last, location=node["location"], links=links, routing=tuple(routes[:32]),
            weight_hash=hashes[-1][1] if hashes else "", recent_hashes=hashes,
            loss=loss if stage == 0 else None, tokens_per_s=1800.0 + 200 * self.rng.random() if stage == 0 else 0.0)

    def _churn(self) -> None:
        online = sorted(p for p, n in self.nodes.items() if n["stage"] > 0 and n["state"] == "online"
                        and p not in (self.diverged, self.lagging))
        victim = self.rng.choice(online)
        stage = self.nodes.pop(victim)["stage"]
        for node in self.nodes.values():
            if node["state"] == "joining":
                node["state"] = "online"
        self._add(stage, "joining")

    def summary(self) -> dict[str, Any]:
        """One read: the swarm one iteration later (and, every few reads, after a crash and a join)."""
        self.reads += 1
        self.iteration += 1
        if self.reads % CHURN_EVERY_READS == 0:
            self._churn()
        bare = {p: self._record(p, []) for p in self.nodes}
        routes: dict[str, list[RouteSummary]] = defaultdict(list)
        units: dict[tuple[str, str, str], int] = defaultdict(int)
        for path in solve(instance_from_records(self.spec, bare)).paths:
            for a, b in itertools.pairwise(path):
                units[(a, b, path[0])] += 1
        for (a, b, sink), n in sorted(units.items()):
            routes[a].append(RouteSummary(next_peer=b, sink=sink, units=n))
        records = {p: self._record(p, routes[p]) for p in self.nodes}
        return summarize(SwarmSnapshot(self.run_id, self.spec, records))
