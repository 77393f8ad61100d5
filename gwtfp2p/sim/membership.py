"""Membership over time: the initial swarm, then the trace's crashes and joins.

A joiner downloads its stage's weights and optimizer state from the live replica it can fetch
them from fastest (a bulk transfer on the simulated network, queued like any other); if that
replica dies first, it starts again from another one. With no live replica of its stage left, it
restores the checkpoint the data holders keep of every stage (docs/design.md §3). A downloaded joiner
becomes active (visible to the routers) at once, or after the step if an aggregation is running;
it takes part in the aggregation that closes its first iteration. Owns no routing.
"""

from __future__ import annotations

from typing import Protocol

from gwtfp2p.sim.churn import Crash, Join, NodePlan, Trace
from gwtfp2p.sim.cluster import Cluster, SimNode
from gwtfp2p.sim.compute import STATE_BYTES_PER_PARAM, ModelSpec, stage_param_count
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.metrics import Metrics
from gwtfp2p.sim.network import Network
from gwtfp2p.sim.params import Scenario
from gwtfp2p.sim.ports import CrashHandler, JoinGate


class MembershipHost(Protocol):
    """What membership uses of the run."""

    engine: Engine
    scenario: Scenario
    model: ModelSpec
    trace: Trace
    cluster: Cluster
    network: Network
    metrics: Metrics

    def make_node(self, plan: NodePlan) -> SimNode:
        """Create ``plan``'s node (not serving yet)."""

    def activate(self, node: SimNode) -> None:
        """``node`` starts serving."""


class Membership:
    def __init__(self, sim: MembershipHost, crashes: CrashHandler, joins: JoinGate) -> None:
        self.sim = sim
        self.crashes = crashes
        self.joins = joins
        self.engine = sim.engine
        n_stages = sim.scenario.n_stages
        self.state_bytes = [STATE_BYTES_PER_PARAM * stage_param_count(sim.model, s, n_stages)
                            for s in range(n_stages + 1)]

    def start(self) -> None:
        for plan in self.sim.trace.initial:
            self.sim.activate(self.sim.make_node(plan))
        for event in self.sim.trace.events:
            self.engine.at(event.time_s, self._on_event, event)

    def _on_event(self, event: Crash | Join) -> None:
        if isinstance(event, Crash):
            node = self.sim.cluster.nodes.get(event.node_id)
            if node is not None and node.alive:
                self.crashes.on_crash(node, event)
            return
        node = self.sim.make_node(event.node)
        self.sim.metrics.joins.append((self.engine.now, node.node_id, node.stage))
        self._download(node)

    def _download(self, node: SimNode) -> None:
        if not node.alive:
            return
        net = self.sim.network
        size = self.state_bytes[node.stage]
        sources = [s for s in self.sim.cluster.active_by_stage[node.stage] if self.sim.cluster.nodes[s].alive]
        if not sources:  # no live replica: restore the data holders' latest checkpoint of the stage
            self.sim.metrics.checkpoint_restores += 1
            sources = list(self.sim.cluster.active_by_stage[0])
        source = min(sources, key=lambda s: (net.link(s, node.node_id)[0] + size / net.link(s, node.node_id)[1], s))
        _, depart, arrive = net.transfer(source, node.node_id, size, self.engine.now)
        self.engine.at(arrive, self._downloaded, node, source, depart)

    def _downloaded(self, node: SimNode, source: str, depart: float) -> None:
        if not node.alive:
            return
        if self.sim.cluster.nodes[source].died_s < depart:
            self._download(node)  # the source died mid-transfer: fetch again from another replica
            return
        self.joins.admit(node)  # serves now, or once a running step is taken
