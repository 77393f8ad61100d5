"""Crashes and recovery in the data plane (docs/design.md §3, and SWARM's hop retry).

A crash loses the node's activations, queued work and accumulated gradients (counted as wasted
GPU time). Every microbatch position it held is recovered once its loss is detected (when, the
router says: heartbeat expiry for GWTF, instantly for the oracle, the request timeout for SWARM):
the nearest upstream hop that still keeps its output resends it to another replica of the lost
stage, which recomputes that one hop. A downstream node that already holds the microbatch either
recognizes the duplicate and resends its cached gradient (GWTF, oracle) or resends the gradient
together with the retried request (SWARM). Owns no routing choices.
"""

from __future__ import annotations

from typing import Protocol

from gwtfp2p.sim.churn import Crash
from gwtfp2p.sim.cluster import FORWARD, Cluster, SimNode, crash_phase
from gwtfp2p.sim.dataplane import DataPlane
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.metrics import Metrics
from gwtfp2p.sim.microbatch import BWD_DONE, FWD_DONE, IN_BWD, NONE, QUEUED_BWD, Microbatch
from gwtfp2p.sim.ports import CrashWatcher
from gwtfp2p.sim.routers.base import Router

RETRY_S = 1.0  # when no replacement is known yet, look again after this long


class RecoveryHost(Protocol):
    """What recovery uses of the run."""

    engine: Engine
    cluster: Cluster
    router: Router
    metrics: Metrics
    iterations: CrashWatcher
    dataplane: DataPlane


class Recovery:
    def __init__(self, sim: RecoveryHost) -> None:
        self.sim = sim
        self.engine = sim.engine
        self.nodes = sim.cluster.nodes

    def on_crash(self, node: SimNode, event: Crash) -> None:
        now = self.engine.now
        phase = crash_phase(node, self.sim.iterations.aggregating_with(node))
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
        if m.done or m.holder[pos] != dead or not self.nodes[sender].alive:
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
        self.sim.dataplane.send_forward(m, up, target, None)
