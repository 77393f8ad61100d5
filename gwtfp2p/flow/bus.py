"""In-memory message bus: runs N FlowNodes over a simulated network in protocol ticks.

Messages take ``delay_ticks`` plus a random jitter (reordering), may be lost with a given probability
and may arrive twice (as when the daemon's transport sends a waiting call once more). Discovery is
modelled as the DHT would do it: a node joining is introduced to its previous-, same- and next-stage
nodes; a node leaving is signalled to every node that knew it. The bus is deterministic for a seed.
Used by tests, ``gwtf flow solve`` and the benchmarks.
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from dataclasses import dataclass

from gwtfp2p.config import FlowParams
from gwtfp2p.flow.check import Snapshot, check_invariants, follow_chains
from gwtfp2p.flow.evaluate import RoutingQuality, evaluate
from gwtfp2p.flow.instance import FlowInstance, NodeSpec, edge_key
from gwtfp2p.flow.load import NodeResources
from gwtfp2p.flow.messages import Envelope
from gwtfp2p.flow.node import FlowNode
from gwtfp2p.flow.wire import decode_message, encode_message


@dataclass(frozen=True)
class NetworkModel:
    delay_ticks: int = 1
    jitter_ticks: int = 0
    loss: float = 0.0
    duplicate: float = 0.0  # probability that a message is delivered a second time, with its own delay
    wire: bool = False  # carry every message through the wire codec, as the daemon does


@dataclass
class Settling:
    """When a run counts as settled: ``quiet_ticks`` ticks with neither a routing change nor work under
    way (a hold that just cleared lets the moves it held start)."""

    quiet_ticks: int
    last_change: int
    last_busy: int

    def note(self, now: int, changed: bool, busy: bool) -> bool:
        """Record tick ``now``; True once the run has been quiet long enough."""
        if changed:
            self.last_change = now
        if busy:
            self.last_busy = now
        return now - max(self.last_change, self.last_busy) >= self.quiet_ticks


@dataclass(frozen=True)
class RunResult:
    quality: RoutingQuality
    ticks_to_converge: int
    ticks_run: int
    messages: int
    messages_to_converge: int
    converged: bool


class MessageBus:
    """Nodes, the in-flight messages between them and the instance they currently form."""

    def __init__(self, instance: FlowInstance, *, seed: int = 0, params: FlowParams | None = None,
                 network: NetworkModel | None = None, check_every_tick: bool = False) -> None:
        self.n_stages = instance.n_stages
        self.params = params or FlowParams()
        self.network = network or NetworkModel()
        self.rng = random.Random(f"bus:{seed}")
        self.seed = seed
        self.now = 0
        self.nodes: dict[str, FlowNode] = {}
        self.specs: dict[str, NodeSpec] = {}
        self.edge_costs: dict[tuple[str, str], float] = dict(instance.edge_costs)
        self.lost_signalled: dict[str, set[str]] = defaultdict(set)
        self.check_every_tick = check_every_tick
        self.violations: list[str] = []
        self.messages = 0
        self._queue: list[tuple[int, int, str, Envelope]] = []
        self._seq = 0
        for spec in instance.nodes:
            self.add_node(spec)

    # -- membership ------------------------------------------------------------------------------
    def instance(self) -> FlowInstance:
        """The instance formed by the live nodes (for the oracle and the evaluator)."""
        return FlowInstance(self.n_stages, tuple(self.specs[k] for k in sorted(self.specs)), {
            k: v for k, v in self.edge_costs.items() if k[0] in self.specs and k[1] in self.specs})

    def add_node(self, spec: NodeSpec, edge_costs: dict[str, float] | None = None) -> None:
        """Start a node and introduce it to its neighbours (``edge_costs``: new edges' costs)."""
        for other, cost in (edge_costs or {}).items():
            self.edge_costs[edge_key(spec.node_id, other)] = cost
        node = FlowNode(spec.node_id, spec.stage, self.n_stages, capacity=spec.capacity, supply=spec.supply,
                        params=self.params, rng=random.Random(f"{self.seed}:{spec.node_id}"),
                        resources=NodeResources(uplink_s_per_unit=spec.uplink_s_per_unit))
        self.nodes[spec.node_id] = node
        self.specs[spec.node_id] = spec
        for other_id in sorted(self.nodes):
            if other_id == spec.node_id:
                continue
            other = self.specs[other_id]
            cost = self.edge_costs.get(edge_key(spec.node_id, other_id))
            if cost is not None or other.stage == spec.stage:
                self.send(spec.node_id, node.add_neighbour(other_id, other.stage, cost, self.now))
                self.send(other_id, self.nodes[other_id].add_neighbour(
                    spec.node_id, spec.stage, cost, self.now))

    def remove_node(self, node_id: str) -> None:
        """The node crashes: it vanishes and every node that knew it is told."""
        self.nodes.pop(node_id, None)
        self.specs.pop(node_id, None)
        for other_id in sorted(self.nodes):
            node = self.nodes[other_id]
            if node_id in node.core.neighbours:
                self.send(other_id, node.lose_neighbour(node_id, self.now))
                self.lost_signalled[other_id].add(node_id)
        self.lost_signalled.pop(node_id, None)

    def measured(self, node_id: str, peer: str, cost_s: float) -> None:
        """``node_id`` now measures its edge to ``peer`` at ``cost_s`` (as a daemon's probe re-costs it); what
        the node sends about it goes out. The instance's true cost (``edge_costs``) is left as it is."""
        self.send(node_id, self.nodes[node_id].set_edge_cost(peer, cost_s, self.now))

    # -- message flow ----------------------------------------------------------------------------
    def send(self, src: str, envelopes: list[Envelope]) -> None:
        """Every message a node sends passes here (a test or benchmark may override it to count or drop some)."""
        for envelope in envelopes:
            self.messages += 1
            if self.network.loss and self.rng.random() < self.network.loss:
                continue
            copies = 2 if self.network.duplicate and self.rng.random() < self.network.duplicate else 1
            for _ in range(copies):
                self._enqueue(src, envelope)

    def _enqueue(self, src: str, envelope: Envelope) -> None:
        delay = self.network.delay_ticks
        if self.network.jitter_ticks:
            delay += self.rng.randint(0, self.network.jitter_ticks)
        if self.network.wire:
            envelope = Envelope(envelope.dst, decode_message(encode_message(envelope.message)))
        self._seq += 1
        heapq.heappush(self._queue, (self.now + max(1, delay), self._seq, src, envelope))

    def step(self) -> None:
        """One tick: deliver what is due, then tick every node."""
        self.now += 1
        while self._queue and self._queue[0][0] <= self.now:
            _, _, _src, envelope = heapq.heappop(self._queue)
            node = self.nodes.get(envelope.dst)
            if node is not None:
                self.send(envelope.dst, node.on_message(envelope.message, self.now))
        for node_id in sorted(self.nodes):
            self.send(node_id, self.nodes[node_id].on_tick(self.now))
        if self.check_every_tick:
            snap = self.check()
            self.violations += [f"tick {self.now}: {v}" for v in snap.violations]

    def work_under_way(self) -> bool:
        """A data holder still wants units and sees a next hop that advertises a path, or an augmenting
        path in its residual labels; or a node still holds cost-driven moves for a blocked holder, holds
        its growth back for a poorer holder, is re-routing a unit, has a proposal out, or holds a unit with
        no next hop yet (work under way)."""
        return any((n.stage == 0 and n.core.demand() > 0
                    and (n.growth.best_next(n.node_id) is not None or n.residual.augmentable()))
                   or n.core.flow_first or n.core.held_back or n.rerouter.current is not None
                   or n.core.pending is not None
                   or bool(n.core.outstanding())
                   for n in self.nodes.values())

    def check(self) -> Snapshot:
        return check_invariants(self.nodes, self.n_stages, self.lost_signalled)

    def routing(self) -> list[tuple[str, ...]]:
        return follow_chains(self.nodes, self.n_stages).paths

    def quality(self) -> RoutingQuality:
        return evaluate(self.instance(), self.routing())

    def run(self, max_ticks: int = 2000, quiet_ticks: int = 60) -> RunResult:
        """Step until for ``quiet_ticks`` ticks the routing has not changed and no work was under way
        (``work_under_way``: a hold that just cleared lets held moves start; or ``max_ticks``)."""
        start, start_messages = self.now, self.messages
        last = sorted(self.routing())
        settling, messages_at_change, converged = Settling(quiet_ticks, self.now, self.now), self.messages, False
        while self.now - start < max_ticks and not converged:
            self.step()
            current = sorted(self.routing())
            changed = current != last
            if changed:
                last, messages_at_change = current, self.messages
            converged = settling.note(self.now, changed, self.work_under_way())
        return RunResult(self.quality(), settling.last_change - start, self.now - start,
                         self.messages - start_messages, messages_at_change - start_messages, converged)
