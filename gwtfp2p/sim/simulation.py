"""One simulated run: a scenario, a seed and a router, wired together and run to the target.

Builds the shared pieces (engine, network, nodes, churn trace, data plane, recovery, iterations)
around the chosen router, runs until the target number of microbatches is trained or the horizon
is reached, and returns the summary and the series the report plots. Also owns the per-node
compute model and the edge cost d(i,j) every router and metric uses.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace
from typing import Protocol

from gwtfp2p.flow.costs import edge_cost_s
from gwtfp2p.flow.geo import geo10
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, adjacent_stages, edge_key
from gwtfp2p.flow.load import NodeResources
from gwtfp2p.sim.churn import NodePlan, Trace, make_trace
from gwtfp2p.sim.cluster import Cluster, SimNode
from gwtfp2p.sim.compute import NodeCompute, get_gpu, get_model, holder_compute, relay_compute
from gwtfp2p.sim.dataplane import DataPlane
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.iteration import Iterations
from gwtfp2p.sim.membership import Membership
from gwtfp2p.sim.metrics import Metrics, RunSummary
from gwtfp2p.sim.network import Network
from gwtfp2p.sim.params import SWARM_ROUTERS, Scenario, check_router
from gwtfp2p.sim.recovery import Recovery
from gwtfp2p.sim.routers import Router, make_router
from gwtfp2p.sim.swarm import SwarmTraining


@dataclass
class RunResult:
    summary: RunSummary
    throughput: list[tuple[float, float]] = field(default_factory=list)  # (bin start s, microbatches/s)
    crash_times: list[float] = field(default_factory=list)
    join_times: list[float] = field(default_factory=list)
    crash_phases: dict[str, int] = field(default_factory=dict)


class Training(Protocol):
    """What the run drives, whichever router: start, activations, and the control-plane count."""

    control_messages: int

    def start(self) -> None:
        """Start training (the initial members are active)."""

    def on_activate(self, node_id: str) -> None:
        """A joiner starts serving."""


class SyncTraining:
    """gwtf and the oracle: the router builds its routing state, the iterations send microbatches."""

    def __init__(self, router: Router, iterations: Iterations) -> None:
        self.router = router
        self.iterations = iterations

    @property
    def control_messages(self) -> int:
        return self.router.control_messages

    def start(self) -> None:
        self.router.start()
        self.iterations.start()

    def on_activate(self, node_id: str) -> None:
        self.router.on_activate(node_id)


class Simulation:
    def __init__(self, scenario: Scenario, seed: int, router: str, trace: Trace | None = None) -> None:
        self.scenario = scenario
        self.seed = seed
        self.model = replace(get_model(scenario.model), codec=scenario.codec)
        self.layers = self.model.stage_layers(scenario.n_stages)
        self.engine = Engine()
        self.network = Network(scenario.network)
        self.cluster = Cluster(self.engine, scenario.n_stages)
        self._compute: dict[str, NodeCompute] = {}
        self._costs: dict[tuple[str, str], float] = {}
        self.trace = trace if trace is not None else make_trace(scenario, seed, self.slots_of)
        self.metrics = Metrics(scenario, self.engine, self.cluster, self.edge_cost)
        self.router_name = check_router(router)
        self.started = False
        if router in SWARM_ROUTERS:  # SWARM's own request loop and steps on the shared models
            self.swarm = SwarmTraining(self, barrier=router == "swarm-barrier")
            self.training: Training = self.swarm
            crashes, joins = self.swarm, self.swarm
        else:  # a router on the shared data plane, held to the iteration barrier
            self.iterations = Iterations(self)
            self.router = make_router(router, self)
            self.dataplane = DataPlane(self)
            self.recovery = Recovery(self)
            self.training = SyncTraining(self.router, self.iterations)
            crashes, joins = self.recovery, self.iterations
        self.membership = Membership(self, crashes, joins)

    # -- models ----------------------------------------------------------------------------------
    def compute_of(self, plan: NodePlan) -> NodeCompute:
        cached = self._compute.get(plan.node_id)
        if cached is None:
            gpu = get_gpu(plan.gpu)
            slowdown = 1.0
            if self.scenario.compute == "heterogeneous":
                factors = geo10().compute_factor
                slowdown = factors[plan.location] / statistics.fmean(factors.values())
            if plan.is_data_holder:
                cached = holder_compute(self.model, gpu, slowdown)
            else:
                cached = relay_compute(self.model, self.layers[plan.stage - 1], gpu, slowdown)
                if self.scenario.max_slots:
                    cached = replace(cached, slots=min(cached.slots, self.scenario.max_slots))
            if self.scenario.stage_compute_s:  # measured: the model sizes memory and transfers only
                measured_s = self.scenario.stage_compute_s[plan.stage]
                cached = replace(cached, forward_s=measured_s / 3, backward_s=2 * measured_s / 3)
            self._compute[plan.node_id] = cached
        return cached

    def slots_of(self, plan: NodePlan) -> int:
        return self.compute_of(plan).slots

    def edge_cost(self, a: str, b: str) -> float:
        """The paper's d(a, b) in seconds for one microbatch (compute, latency, transfer)."""
        key = (a, b) if a <= b else (b, a)
        cost = self._costs.get(key)
        if cost is None:
            na, nb = self.cluster.nodes[a], self.cluster.nodes[b]
            lat_ab, bw_ab = self.network.link(a, b)
            lat_ba, bw_ba = self.network.link(b, a)
            cost = edge_cost_s(na.forward_s + na.backward_s, nb.forward_s + nb.backward_s, lat_ab, lat_ba,
                               bw_ab, bw_ba, self.model.activation_bytes)
            self._costs[key] = cost
        return cost

    def resources_of(self, node: SimNode) -> NodeResources:
        """GPU and uplink seconds per unit (``flow.load``). A unit uploads its activations forward
        and its gradient backward; the uplink counts where a node's uploads share it (home, lab)."""
        compute_s = node.forward_s + node.backward_s
        uplink = self.network.access.get(node.node_id, (0.0, 0.0))[0]
        if not self.scenario.flow_uplink_aware or not self.network.spec.shared_uplink or uplink <= 0:
            return NodeResources(compute_s_per_unit=compute_s)
        return NodeResources.from_uplink(compute_s_per_unit=compute_s, uplink_bytes_per_s=uplink,
                                         upload_bytes_per_unit=2 * self.model.activation_bytes)

    def flow_instance(self, idle_holders: frozenset[str] = frozenset()) -> FlowInstance:
        """The live, active swarm as a flow instance (for the oracle); idle holders want nothing."""
        scenario = self.scenario
        budget = scenario.flow_iteration_budget_s
        members = [n for stage in self.cluster.active_by_stage for n in stage if self.cluster.nodes[n].alive]
        specs = []
        for node_id in members:
            node = self.cluster.nodes[node_id]
            resources = self.resources_of(node)
            wanted = scenario.microbatches_per_dh if node.is_data_holder and node_id not in idle_holders else 0
            capacity = 0 if node.is_data_holder else resources.capacity(node.slots, budget)
            specs.append(NodeSpec(node_id, node.stage, capacity, resources.capacity(wanted, budget),
                                  node.forward_s + node.backward_s, node.plan.location, resources.uplink_s_per_unit))
        costs = {}
        for i, a in enumerate(specs):
            for b in specs[i + 1:]:
                if adjacent_stages(a.stage, b.stage, scenario.n_stages):
                    costs[edge_key(a.node_id, b.node_id)] = self.edge_cost(a.node_id, b.node_id)
        return FlowInstance(scenario.n_stages, tuple(specs), costs)

    # -- membership ------------------------------------------------------------------------------
    def make_node(self, plan: NodePlan) -> SimNode:
        node = SimNode(plan, self.compute_of(plan), self.engine.now)
        self.cluster.add(node)
        self.network.add_node(plan.node_id, plan.location, plan.access)
        return node

    def activate(self, node: SimNode) -> None:
        node.born_s = self.engine.now
        self.cluster.activate(node)
        if self.started:
            self.training.on_activate(node.node_id)

    # -- running -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Create the initial swarm, schedule the trace and start the first iteration."""
        self.membership.start()
        self.started = True
        self.training.start()

    def run(self, bin_s: float | None = None) -> RunResult:
        self.start()
        self.engine.run(self.scenario.horizon_s)
        return self.result(bin_s)

    def result(self, bin_s: float | None = None) -> RunResult:
        summary = self.metrics.summary(self.router_name, self.seed, self.training.control_messages)
        phases: dict[str, int] = {}
        for _, _, phase, _ in self.metrics.crashes:
            phases[phase] = phases.get(phase, 0) + 1
        return RunResult(summary, self.metrics.throughput_series(bin_s),
                         [c[0] for c in self.metrics.crashes], [j[0] for j in self.metrics.joins], phases)


def run_once(scenario: Scenario, seed: int, router: str, bin_s: float | None = None) -> RunResult:
    return Simulation(scenario, seed, router).run(bin_s)
