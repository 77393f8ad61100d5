"""The ``gwtf`` router: the decentralized FlowNode protocol, its messages on the simulated network.

Every active node runs the daemon's own ``FlowNode`` (gwtfp2p/flow). All nodes tick together every
``flow_tick_s``; each message a FlowNode returns is carried as a small control message (latency +
size/bandwidth) and handed to ``on_message`` at arrival. A newcomer is introduced to its
previous-, same- and next-stage nodes as the DHT would. What a node knows of its neighbours it
measures (``sensing.py``): edge costs from its pings and transfers, re-measured every probe
period, and a crash once its own detection delay has passed (``lose_neighbour``), or earlier when
a send to the dead node failed.

The data plane reads the routing tables: a data holder sends one microbatch per complete flow
unit; a relay forwards along the out-unit matched to the unit the microbatch arrived on. Where
that unit is gone (moved, dropped) or its next hop is known dead, it uses another of its units to
the same sink (least loaded), else its cheapest next-stage neighbour (docs/design.md §3).
"""

from __future__ import annotations

import random

from gwtfp2p.flow.instance import adjacent_stages
from gwtfp2p.flow.messages import Envelope, Message
from gwtfp2p.flow.node import FlowNode
from gwtfp2p.sim.cluster import SimNode
from gwtfp2p.sim.microbatch import Microbatch
from gwtfp2p.sim.ports import RouterHost
from gwtfp2p.sim.routers.base import Router
from gwtfp2p.sim.routers.sensing import Sensing


class GwtfRouter(Router):
    name = "gwtf"
    recover_through_dead_upstream = False  # only a live node that learnt of a death acts on it

    def __init__(self, sim: RouterHost) -> None:
        super().__init__(sim)
        scenario = sim.scenario
        self.params = scenario.flow_params()
        self.tick_s = scenario.flow_tick_s
        self.n_stages = scenario.n_stages
        self.sensing = Sensing(scenario.sensing, scenario.dataplane.crash_mode, sim.seed)
        self.probe_rng = random.Random(f"probes:{scenario.name}:{sim.seed}")
        self.tick = 0
        self.flows: dict[str, FlowNode] = {}
        self.order: list[str] = []
        self.links: dict[str, set[str]] = {}  # node -> its neighbours of the adjacent stages (pinged)
        self.crash_phase: dict[str, float] = {}  # dead node -> where in its heartbeat period it died
        self._detect_s: dict[tuple[str, str], float] = {}
        self.busy: dict[str, dict[str, Microbatch]] = {}  # data holder -> out-unit id -> its microbatch
        self.in_flight: dict[str, int] = {}

    # -- life cycle ------------------------------------------------------------------------------
    def start(self) -> None:
        for stage_members in self.sim.cluster.active_by_stage:
            for node_id in stage_members:
                self._add(self.nodes[node_id])
        self.engine.at(self.engine.now + self.tick_s, self._tick)

    def on_activate(self, node_id: str) -> None:
        self._add(self.nodes[node_id])

    def _add(self, node: SimNode) -> None:
        scenario = self.sim.scenario
        flow = FlowNode(node.node_id, node.stage, self.n_stages,
                        capacity=0 if node.is_data_holder else node.slots,
                        supply=scenario.microbatches_per_dh if node.is_data_holder else 0,
                        resources=self.sim.resources_of(node),
                        params=self.params, rng=random.Random(f"{self.sim.seed}:{node.node_id}"))
        if node.is_data_holder:
            self.busy[node.node_id] = {}
            self.in_flight[node.node_id] = 0
        self.links[node.node_id] = set()
        for other_id in self.order:
            other = self.nodes[other_id]
            adjacent = adjacent_stages(node.stage, other.stage, self.n_stages)
            if not adjacent and other.stage != node.stage:
                continue
            mine = theirs = None
            if adjacent:  # each side pings the other when they meet
                self.links[node.node_id].add(other_id)
                self.links[other_id].add(node.node_id)
                mine, theirs = self._measure(node.node_id, other_id), self._measure(other_id, node.node_id)
            self._send(node.node_id, flow.add_neighbour(other_id, other.stage, mine, self.tick))
            self._send(other_id, self.flows[other_id].add_neighbour(node.node_id, node.stage, theirs, self.tick))
        self.flows[node.node_id] = flow
        self.order = sorted(self.flows)
        period = self.sim.scenario.sensing.probe_period_s
        self.engine.at(self.engine.now + self.probe_rng.uniform(0.0, period), self._probe, node.node_id)

    # -- measurements ----------------------------------------------------------------------------
    def _measure(self, observer: str, peer: str) -> float | None:
        """``observer`` pings ``peer``; returns its new cost estimate (None: no change for the flow)."""
        self.sensing.ping(observer, peer, self.sim.network.round_trip_s(observer, peer))
        a, b = self.nodes[observer], self.nodes[peer]
        cost = self.sensing.cost(observer, peer, a.forward_s + a.backward_s, b.forward_s + b.backward_s,
                                 self.sim.model.activation_bytes)
        return self.sensing.flow_update(observer, peer, cost) if cost is not None else None

    def _probe(self, node_id: str) -> None:
        """Every probe period a node pings its adjacent-stage neighbours and re-costs changed edges."""
        flow = self.flows.get(node_id)
        if flow is None:
            return
        for peer in sorted(self.links[node_id]):
            if self.believes_alive(node_id, peer) and self.nodes[peer].alive:
                cost = self._measure(node_id, peer)
                if cost is not None and flow.has_neighbour(peer):
                    self._send(node_id, flow.set_edge_cost(peer, cost, self.tick))
        self.engine.at(self.engine.now + self.sim.scenario.sensing.probe_period_s, self._probe, node_id)

    def on_transfer(self, sender: str, receiver: str, size_bytes: float, requested_s: float) -> None:
        ack_s = self.engine.now + self.sim.network.link(receiver, sender)[0]
        self.sensing.transfer_acked(sender, receiver, size_bytes, ack_s - requested_s)

    def seen_cost(self, observer: str, candidate: str) -> float:
        a, b = self.nodes[observer], self.nodes[candidate]
        cost = self.sensing.cost(observer, candidate, a.forward_s + a.backward_s, b.forward_s + b.backward_s,
                                 self.sim.model.activation_bytes)
        return self.sim.edge_cost(observer, candidate) if cost is None else cost

    def on_crash(self, node_id: str, phase_u: float) -> None:
        if self.flows.pop(node_id, None) is not None:
            self.order = sorted(self.flows)
        self.crash_phase[node_id] = phase_u
        self.links.pop(node_id, None)
        for other_id in self.order:  # each neighbour learns of it after its own delay
            if self.flows[other_id].has_neighbour(node_id):
                self.engine.at(self.learns_at(other_id, node_id), self._learn, other_id, node_id)

    def learns_at(self, observer: str, dead: str) -> float:
        """When ``observer`` holds ``dead`` for dead on its own (heartbeats, pings)."""
        key = (observer, dead)
        delay = self._detect_s.get(key)
        if delay is None:
            delay = self._detect_s[key] = self.sensing.detect_delay_s(observer, dead, self.crash_phase[dead])
        return self.nodes[dead].died_s + delay

    def _learn(self, observer: str, dead: str) -> None:
        if self.nodes[observer].alive:
            self.on_failure_detected(None, observer, dead)

    # -- control plane on the simulated network ------------------------------------------------------
    def _send(self, src: str, envelopes: list[Envelope]) -> None:
        if not envelopes:
            return
        now = self.engine.now
        delay = self.sim.network.control_delay
        for envelope in envelopes:
            dst = envelope.dst
            if dst in self.flows:
                self.control_messages += 1
                self.engine.at(now + delay(src, dst), self._deliver, dst, envelope.message)

    def _deliver(self, dst: str, message: Message) -> None:
        flow = self.flows.get(dst)
        if flow is not None:
            self._send(dst, flow.on_message(message, self.tick))

    def _tick(self) -> None:
        self.tick += 1
        for node_id in self.order:
            self._send(node_id, self.flows[node_id].on_tick(self.tick))
        self.sim.iterations.try_dispatch()
        self.engine.at(self.engine.now + self.tick_s, self._tick)

    # -- data plane --------------------------------------------------------------------------------
    def believes_alive(self, observer: str, node_id: str) -> bool:
        return self.nodes[node_id].alive or node_id not in self.nodes[observer].suspects

    def _free_units(self, dh: str) -> tuple[int, list]:
        flow = self.flows.get(dh)
        if flow is None:
            return 0, []
        busy = self.busy[dh]
        complete = [o for o in flow.out_hops(complete_only=True) if self.believes_alive(dh, o.next)]
        free = [o for o in complete if o.edge_id not in busy]
        return len(complete), free

    def can_dispatch(self, dh: str) -> bool:
        units, free = self._free_units(dh)
        return bool(free) and self.in_flight[dh] < units

    def first_hop(self, dh: str, m: Microbatch) -> tuple[str, object]:
        _, free = self._free_units(dh)
        unit = min(free, key=lambda o: (o.down_cost, o.edge_id))
        self.busy[dh][unit.edge_id] = m
        self.in_flight[dh] += 1
        m.unit = unit.edge_id
        return unit.next, unit.edge_id

    def release(self, dh: str, m: Microbatch) -> None:
        self.in_flight[dh] -= 1
        if self.busy[dh].get(m.unit) is m:
            del self.busy[dh][m.unit]

    def next_hop(self, node_id: str, m: Microbatch, pos: int) -> tuple[str, object]:
        flow = self.flows.get(node_id)
        edge = m.tag[pos - 1]
        if flow is not None and edge is not None:
            out = flow.next_hop(edge)
            if out is not None and out.confirmed and self.believes_alive(node_id, out.next):
                return out.next, out.edge_id
        return self._fallback(node_id, m, pos, None)

    def replacement(self, sender: str, m: Microbatch, pos: int, dead: str) -> str | None:
        return self._fallback(sender, m, pos, dead)[0]

    def _fallback(self, node_id: str, m: Microbatch, pos: int, exclude: str | None) -> tuple[str | None, object]:
        """Another of this node's units to the same sink (least loaded), else the cheapest neighbour."""
        flow = self.flows.get(node_id)
        best, best_key = None, None
        if flow is not None:
            for out in flow.out_hops(sink=m.dh):
                if not out.confirmed or out.next == exclude:
                    continue
                if not self.believes_alive(node_id, out.next):
                    continue
                key = (len(self.nodes[out.next].mbs), out.down_cost, out.edge_id)
                if best_key is None or key < best_key:
                    best, best_key = out, key
        if best is not None:
            return best.next, best.edge_id
        target = self.cheapest(node_id, pos, exclude) or self.cheapest(node_id, pos, exclude, observer=None)
        return target, None

    # -- failure detection -----------------------------------------------------------------------
    def holder_crash_detect(self, m: Microbatch, pos: int, dead: str, crash_s: float,
                            phase_u: float) -> float | None:
        self.crash_phase.setdefault(dead, phase_u)
        return self.learns_at(m.holder[pos - 1], dead)

    def send_failure_detect(self, m: Microbatch, pos: int, kind: int, sender: str, dead: str,
                            sent_s: float) -> float:
        return max(self.learns_at(sender, dead), sent_s + self.sim.network.round_trip_s(sender, dead))

    def backward_failure_notify_s(self, downstream: str, upstream: str) -> float:
        return self.sim.network.control_delay(downstream, upstream)

    def on_failure_detected(self, m: Microbatch | None, observer: str, dead: str) -> None:
        node = self.nodes[observer]
        if dead in node.suspects:
            return
        node.suspects.add(dead)
        self.sensing.forget(observer, dead)
        self.links.get(observer, set()).discard(dead)
        flow = self.flows.get(observer)
        if flow is not None and flow.has_neighbour(dead):
            self._send(observer, flow.lose_neighbour(dead, self.tick))
