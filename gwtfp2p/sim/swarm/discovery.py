"""What SWARM's trainers see of the servers: DHT records, re-declared and expiring.

A server declares its expert every ``declare_period_s`` with a ``record_expiration_s`` expiration
(yandex-research/swarm ``swarm/pipeline/src/moe/server/dht_handler.py:30-37``); declarations stop
when it dies, so its record lingers until the last one expires. Each trainer's balancer of a stage
re-reads the records every ``balancer_update_period_s`` at its own phase
(``swarm/pipeline/src/moe/client/balancer.py:41-74``),
so a joiner is found within one period and a dead server stays listed until its record expires.
Owns the records only; the balancers decide.
"""

from __future__ import annotations

from gwtfp2p.sim.cluster import SimNode
from gwtfp2p.sim.params import SwarmParams


class Records:
    """The DHT's expert records of every stage, as of any moment."""

    def __init__(self, params: SwarmParams, nodes: dict[str, SimNode]) -> None:
        self.params = params
        self.nodes = nodes
        self.declared_at: dict[str, float] = {}  # server -> when it first declared itself
        self._by_stage: dict[int, list[str]] = {}

    def declare(self, node_id: str, now: float) -> None:
        """``node_id`` starts serving and declaring itself."""
        self.declared_at[node_id] = now
        self._by_stage.setdefault(self.nodes[node_id].stage, []).append(node_id)

    def expiration(self, node_id: str, now: float) -> float:
        """Expiration of the server's record as of ``now`` (declarations stop when it dies)."""
        start = self.declared_at[node_id]
        last_seen = min(now, self.nodes[node_id].died_s)
        period = self.params.declare_period_s
        last_declared = start + int((last_seen - start) // period) * period
        return last_declared + self.params.record_expiration_s

    def of_stage(self, stage: int, now: float) -> dict[str, float]:
        """Unexpired records of ``stage``: server -> expiration."""
        records = {}
        for node_id in self._by_stage.get(stage, ()):
            expiration = self.expiration(node_id, now)
            if expiration > now:
                records[node_id] = expiration
        return records
