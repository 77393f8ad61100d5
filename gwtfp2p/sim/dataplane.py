"""The data plane in simulated time: microbatches forward along routes and gradients back.

Every router shares this code; only the router's choices differ (first hop, next hop, the
replica that takes over after a failure). A hop sends its output over the network, the receiver
acknowledges on receipt and queues the compute; the sender keeps its output until the gradient
comes back. Backward goes to the node that ran the forward (it holds the activations). A message
from a node that died before the message left it, or for a holder that was replaced meanwhile,
is dropped. Failures are handed to ``recovery``; ``iterations`` hears about completed microbatches.
"""

from __future__ import annotations

from typing import Protocol

from gwtfp2p.sim.cluster import BACKWARD, FORWARD, LOSS, Cluster, SimNode
from gwtfp2p.sim.compute import ModelSpec
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.metrics import Metrics
from gwtfp2p.sim.microbatch import (
    BWD_DONE,
    FWD_DONE,
    IN_BWD,
    IN_FWD,
    QUEUED_BWD,
    QUEUED_FWD,
    Microbatch,
)
from gwtfp2p.sim.network import Network
from gwtfp2p.sim.ports import CompletionSink, LossHandler
from gwtfp2p.sim.routers.base import Router


class DataPlaneHost(Protocol):
    """What the data plane uses of the run."""

    engine: Engine
    network: Network
    cluster: Cluster
    model: ModelSpec
    router: Router
    recovery: LossHandler
    iterations: CompletionSink
    metrics: Metrics


class DataPlane:
    def __init__(self, sim: DataPlaneHost) -> None:
        self.sim = sim
        self.engine = sim.engine
        self.net = sim.network
        self.cluster = sim.cluster
        self.nodes = sim.cluster.nodes
        self.size = sim.model.activation_bytes
        sim.cluster.on_task_done = self._task_done

    # -- forward ---------------------------------------------------------------------------
    def dispatch(self, m: Microbatch) -> None:
        """The data holder embeds the microbatch and sends it to its first hop."""
        m.state[0] = FWD_DONE
        m.dispatched_s = self.engine.now
        target, tag = self.sim.router.first_hop(m.dh, m)
        self.send_forward(m, 0, target, tag)

    def send_forward(self, m: Microbatch, pos: int, target: str, tag: object, duplicate: bool = False) -> None:
        """Send the output of position ``pos`` to ``target`` as the input of ``pos + 1``."""
        nxt = pos + 1
        now = self.engine.now
        if not duplicate:
            old = m.holder[nxt]
            if nxt < m.last and old is not None and old != target:
                self.forget(old, m)
            m.holder[nxt] = target
            m.attempt[nxt] += 1
            m.tag[nxt] = tag
            m.state[nxt] = IN_FWD
            m.grad_waiting[nxt] = False
            m.checkpointed[nxt] = False
            if nxt < m.last:
                self.nodes[target].mbs[m.mb_id] = m
        _, depart, arrive = self.net.transfer(m.holder[pos], target, self.size, now)
        m.fwd_depart[nxt] = depart
        self.engine.at(arrive, self._arrive_forward, m, nxt, m.attempt[nxt], m.attempt[pos], depart, duplicate, now)

    def _arrive_forward(self, m: Microbatch, pos: int, attempt: int, src_attempt: int, depart: float,
                        duplicate: bool, sent_s: float) -> None:
        if m.done or m.attempt[pos] != attempt or m.attempt[pos - 1] != src_attempt:
            return
        src = m.holder[pos - 1]
        if self.nodes[src].died_s < depart:
            return  # lost with its sender; the sender's recovery redoes it
        dst = self.nodes[m.holder[pos]]
        if not dst.alive:
            self.sim.recovery.send_failed(m, pos, FORWARD, src, dst.node_id, sent_s)
            return
        self.sim.router.on_transfer(src, dst.node_id, self.size, sent_s)
        if duplicate and m.state[pos] != IN_FWD:
            if m.state[pos] == BWD_DONE:
                self.send_backward(m, pos - 1)  # recognized duplicate: resend the cached gradient
            return
        m.state[pos] = QUEUED_FWD
        if pos == m.last:
            self.cluster.submit(dst, (LOSS, m, pos, attempt, dst.forward_s + dst.backward_s))
        else:
            self.cluster.submit(dst, (FORWARD, m, pos, attempt, dst.forward_s))

    def _forward_done(self, node: SimNode, m: Microbatch, pos: int) -> None:
        m.state[pos] = FWD_DONE
        if len(m.path) <= pos:
            m.path.append(node.node_id)
        if m.grad_waiting[pos]:
            m.grad_waiting[pos] = False
            m.state[pos] = QUEUED_BWD
            self.cluster.submit(node, (BACKWARD, m, pos, m.attempt[pos], self.cluster.backward_s(node, m, pos)))
            return
        nxt = pos + 1
        router = self.sim.router
        downstream = m.holder[nxt]
        if m.state[nxt] >= IN_FWD and downstream is not None and router.believes_alive(node.node_id, downstream):
            self.send_forward(m, pos, downstream, m.tag[nxt], duplicate=True)
            return
        if nxt == m.last:
            self.send_forward(m, pos, m.dh, None)
            return
        target, tag = router.next_hop(node.node_id, m, nxt)
        self.send_forward(m, pos, target, tag)

    # -- backward --------------------------------------------------------------------------
    def send_backward(self, m: Microbatch, pos: int) -> None:
        """Send the gradient computed at ``pos + 1`` to the holder of ``pos``."""
        src, dst = m.holder[pos + 1], m.holder[pos]
        now = self.engine.now
        if m.state[pos] == FWD_DONE:
            m.state[pos] = IN_BWD
        _, depart, arrive = self.net.transfer(src, dst, self.size, now)
        m.bwd_depart[pos] = depart
        self.engine.at(arrive, self._arrive_backward, m, pos, m.attempt[pos], m.attempt[pos + 1], depart, now)

    def _arrive_backward(self, m: Microbatch, pos: int, attempt: int, src_attempt: int, depart: float,
                         sent_s: float) -> None:
        if m.done or m.attempt[pos] != attempt or m.attempt[pos + 1] != src_attempt:
            return
        src = m.holder[pos + 1]
        if self.nodes[src].died_s < depart:
            return
        dst = self.nodes[m.holder[pos]]
        if not dst.alive:
            self.sim.recovery.send_failed(m, pos, BACKWARD, src, dst.node_id, sent_s)
            return
        self.sim.router.on_transfer(src, dst.node_id, self.size, sent_s)
        if pos == 0:
            self._complete(m)
            return
        state = m.state[pos]
        if state in (FWD_DONE, IN_BWD):
            m.state[pos] = QUEUED_BWD
            self.cluster.submit(dst, (BACKWARD, m, pos, attempt, self.cluster.backward_s(dst, m, pos)))
        elif state in (IN_FWD, QUEUED_FWD):
            m.grad_waiting[pos] = True  # the forward is being recomputed here

    # -- compute results -------------------------------------------------------------------
    def _task_done(self, node: SimNode, task: tuple) -> None:
        kind, m, pos, attempt, duration = task
        if m.done or m.attempt[pos] != attempt or m.holder[pos] != node.node_id:
            self.cluster.discarded_s += duration
            self.cluster.release_slot(node, m.mb_id)
            return
        node.iteration_compute_s += duration
        if kind == FORWARD:
            self._forward_done(node, m, pos)
        else:
            m.state[pos] = BWD_DONE
            if kind == BACKWARD:
                self.cluster.release_slot(node, m.mb_id)
            self.send_backward(m, pos - 1)

    def _complete(self, m: Microbatch) -> None:
        m.done = True
        m.state[0] = BWD_DONE
        nodes, mb_id = self.nodes, m.mb_id
        for pos in range(1, m.last):
            holder = m.holder[pos]
            if holder is not None:  # its work for m is done: nothing queued, no slot left to free
                node = nodes[holder]
                node.mbs.pop(mb_id, None)
                node.slot_holders.discard(mb_id)
        self.sim.router.release(m.dh, m)
        self.sim.metrics.on_complete(m, self.engine.now)
        self.sim.iterations.on_complete(m)

    def forget(self, node_id: str, m: Microbatch) -> None:
        """``node_id`` no longer serves ``m``: drop its queued work and free its memory slot."""
        node = self.nodes[node_id]
        if node.mbs.pop(m.mb_id, None) is not None or m.mb_id in node.slot_holders:
            self.cluster.drop_queued(node, m.mb_id)
