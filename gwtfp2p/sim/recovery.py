"""Crashes and recovery in the data plane (DESIGN.md §3, and SWARM's hop retry).

A crash loses the node's activations, queued work and accumulated gradients (counted as wasted
GPU time). Every microbatch position it held is recovered once its loss is detected (when, the
router says: heartbeat expiry for GWTF, instantly for the oracle, the request timeout for SWARM):
the nearest upstream hop that still keeps its output resends it to another replica of the lost
stage, which recomputes that one hop. A downstream node that already holds the microbatch either
recognizes the duplicate and resends its cached gradient (GWTF, oracle) or resends the gradient
together with the retried request (SWARM). Owns no routing choices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gwtfp2p.sim.churn import Crash
from gwtfp2p.sim.cluster import BACKWARD, FORWARD, LOSS, SimNode
from gwtfp2p.sim.microbatch import BWD_DONE, FWD_DONE, IN_BWD, NONE, QUEUED_BWD, Microbatch

if TYPE_CHECKING:
    from gwtfp2p.sim.simulation import Simulation

RETRY_S = 1.0  # when no replacement is known yet, look again after this long


class Recovery:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.engine = sim.engine
        self.nodes = sim.cluster.nodes

    def on_crash(self, node: SimNode, event: Crash) -> None:
        now = self.engine.now
        phase = self._phase(node)
        was_active = node.active
        lost = self.sim.cluster.kill(node, now)
        self.sim.metrics.on_crash(now, node.node_id, phase, lost)
        router = self.sim.router
        affected = sorted(node.mbs.values(), key=lambda mb: mb.mb_id)
        node.mbs.clear()
        for m in affected:
            pos = node.stage
            if m.done or m.holder[pos] != node.node_id or not self._lost(m, pos, now):
                continue
            detect_s = router.holder_crash_detect(m, pos, node.node_id, now, event.phase_u)
            if detect_s is not None:
                self.engine.at(detect_s, self.recover, m, pos, node.node_id)
        if was_active:
            router.on_crash(node.node_id, event.phase_u)
        self.sim.iterations.on_crash(node)

    def _phase(self, node: SimNode) -> str:
        if self.sim.iterations.aggregating_with(node):
            return "aggregation"
        if not node.active:
            return "joining"
        if node.running is not None:
            return {FORWARD: "forward", BACKWARD: "backward", LOSS: "loss"}[node.running[0]]
        return "holding" if node.slot_holders else "idle"

    @staticmethod
    def _lost(m: Microbatch, pos: int, crash_s: float) -> bool:
        state = m.state[pos]
        if state == NONE:
            return False
        if state == BWD_DONE:  # its gradient is lost only if it had not left yet
            return m.state[pos - 1] in (FWD_DONE, IN_BWD) and m.bwd_depart[pos - 1] > crash_s
        return True

    def send_failed(self, m: Microbatch, pos: int, kind: int, sender: str, dead: str, sent_s: float) -> None:
        """A message for the dead holder of ``pos`` was lost; the sender notices when the router says."""
        detect_s = self.sim.router.send_failure_detect(m, pos, kind, sender, dead, sent_s)
        self.engine.at(detect_s, self._send_failure_detected, m, pos, kind, sender, dead)

    def _send_failure_detected(self, m: Microbatch, pos: int, kind: int, sender: str, dead: str) -> None:
        router = self.sim.router
        if m.done or m.holder[pos] != dead or not router.detector_alive(m, sender):
            return
        router.on_failure_detected(m, sender, dead)
        if kind == FORWARD:
            self.recover(m, pos, dead)
            return
        upstream = m.holder[pos - 1]
        delay = router.backward_failure_notify_s(sender, upstream)
        self.engine.at(self.engine.now + delay, self.recover, m, pos, dead)

    def recover(self, m: Microbatch, pos: int, dead: str) -> None:
        """Redo position ``pos`` of ``m`` on another replica, from the upstream hop's kept output."""
        if m.done or m.holder[pos] != dead:
            return
        up = pos - 1
        upstream = self.nodes[m.holder[up]]
        router = self.sim.router
        if not upstream.alive:
            if router.recover_through_dead_upstream:
                self.recover(m, up, upstream.node_id)  # redo from the nearest live kept output
            return  # otherwise the upstream's own recovery redoes this hop as well
        if m.state[up] >= QUEUED_BWD:
            return
        if m.state[up] < FWD_DONE:  # the upstream is recomputing its own output: look again later
            self.engine.at(self.engine.now + RETRY_S, self.recover, m, pos, dead)
            return
        router.on_failure_detected(m, upstream.node_id, dead)
        target = router.replacement(upstream.node_id, m, pos, dead)
        if target is None:
            self.engine.at(self.engine.now + RETRY_S, self.recover, m, pos, dead)
            return
        m.recomputed += 1
        self.sim.metrics.recoveries += 1
        downstream = m.holder[pos + 1]
        resend_gradient = (not router.dedupe_by_duplicate and m.state[pos + 1] == BWD_DONE
                           and self.nodes[downstream].alive)
        self.sim.dataplane.send_forward(m, up, target, None)
        if resend_gradient:  # SWARM: inputs and gradient travel with the retried request
            m.grad_resent[pos] = True
            self.sim.dataplane.send_backward(m, pos)
