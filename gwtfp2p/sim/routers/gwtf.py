"""The ``gwtf`` router: the decentralized FlowNode protocol, its messages on the simulated network.

Every active node runs the daemon's own ``FlowNode`` (gwtfp2p/flow). All nodes tick together every
``flow_tick_s``; each message a FlowNode returns is carried as a small control message (latency +
size/bandwidth) and handed to ``on_message`` at arrival. A newcomer is introduced to its
previous-, same- and next-stage nodes as the DHT would; a crash is reported to its neighbours
(``lose_neighbour``) when its liveness record expires, or earlier to a node whose send to it failed.

The data plane reads the routing tables: a data holder sends one microbatch per complete flow
unit; a relay forwards along the out-unit matched to the unit the microbatch arrived on. Where
that unit is gone (moved, dropped) or its next hop is known dead, it uses another of its units to
the same sink (least loaded), else its cheapest next-stage neighbour (DESIGN.md §3).
"""

from __future__ import annotations

import random

from gwtfp2p.flow.instance import adjacent_stages
from gwtfp2p.flow.messages import Envelope, Message
from gwtfp2p.flow.node import FlowNode
from gwtfp2p.sim.cluster import SimNode
from gwtfp2p.sim.microbatch import Microbatch
from gwtfp2p.sim.routers.base import Router


class GwtfRouter(Router):
    name = "gwtf"
    dedupe_by_duplicate = True
    recover_through_dead_upstream = False  # only a live node that learnt of a death acts on it

    def __init__(self, sim) -> None:
        super().__init__(sim)
        scenario = sim.scenario
        self.params = scenario.flow_params()
        self.tick_s = scenario.flow_tick_s
        self.n_stages = scenario.n_stages
        self.dataplane_params = scenario.dataplane
        self.tick = 0
        self.flows: dict[str, FlowNode] = {}
        self.order: list[str] = []
        self.expired: set[str] = set()  # crashed nodes whose liveness record has expired
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
                        params=self.params, rng=random.Random(f"{self.sim.seed}:{node.node_id}"))
        if node.is_data_holder:
            self.busy[node.node_id] = {}
            self.in_flight[node.node_id] = 0
        for other_id in self.order:
            other = self.nodes[other_id]
            adjacent = adjacent_stages(node.stage, other.stage, self.n_stages)
            if not adjacent and other.stage != node.stage:
                continue
            cost = self.sim.edge_cost(node.node_id, other_id) if adjacent else None
            self._send(node.node_id, flow.add_neighbour(other_id, other.stage, cost, self.tick))
            self._send(other_id, self.flows[other_id].add_neighbour(node.node_id, node.stage, cost, self.tick))
        self.flows[node.node_id] = flow
        self.order = sorted(self.flows)

    def on_crash(self, node_id: str, phase_u: float) -> None:
        if self.flows.pop(node_id, None) is not None:
            self.order = sorted(self.flows)
        delay = self.dataplane_params.heartbeat_detect_s(phase_u)
        self.engine.at(self.engine.now + delay, self._expire, node_id)

    def _expire(self, node_id: str) -> None:
        """The dead node's liveness record expired: every neighbour drops it."""
        self.expired.add(node_id)
        for other_id in self.order:
            flow = self.flows[other_id]
            if flow.has_neighbour(node_id):
                self._send(other_id, flow.lose_neighbour(node_id, self.tick))

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
        if self.nodes[node_id].alive:
            return True
        return node_id not in self.expired and node_id not in self.nodes[observer].suspects

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
        return crash_s + self.dataplane_params.heartbeat_detect_s(phase_u)

    def send_failure_detect(self, m: Microbatch, pos: int, kind: int, sender: str, dead: str,
                            sent_s: float) -> float:
        net, params = self.sim.network, self.dataplane_params
        rtt = net.round_trip_s(sender, dead)
        if params.crash_mode == "refused":
            return sent_s + rtt
        transfer_s = self.sim.model.activation_bytes / net.link(sender, dead)[1]
        return sent_s + max(params.ack_timeout_floor_s, params.ack_timeout_factor * (rtt + transfer_s))

    def backward_failure_notify_s(self, downstream: str, upstream: str) -> float:
        return self.sim.network.control_delay(downstream, upstream)

    def on_failure_detected(self, m: Microbatch, observer: str, dead: str) -> None:
        node = self.nodes[observer]
        if dead in node.suspects:
            return
        node.suspects.add(dead)
        flow = self.flows.get(observer)
        if flow is not None and flow.has_neighbour(dead):
            self._send(observer, flow.lose_neighbour(dead, self.tick))
