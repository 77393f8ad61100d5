"""Iterations: the data holders' microbatch queues, the barrier and the per-stage aggregation.

An iteration gives every data holder ``microbatches_per_dh`` microbatches; a holder sends one
whenever its router admits it (a free flow unit for GWTF and the oracle, at once for SWARM).
When every holder has all its microbatches back, each stage's live replicas all-reduce their
gradients (hivemind's butterfly all-reduce, as SWARM and our daemon use); a replica that dies meanwhile
is dropped and the reduction restarts without it after a detection delay. Joiners whose state is
downloaded become active at the boundary. The run stops when the target count is trained.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from gwtfp2p.sim.cluster import SimNode
from gwtfp2p.sim.compute import GRAD_BYTES_PER_PARAM, stage_param_count
from gwtfp2p.sim.microbatch import Microbatch
from gwtfp2p.sim.network import Network

if TYPE_CHECKING:
    from gwtfp2p.sim.simulation import Simulation

def butterfly_allreduce_s(net: Network, members: list[str], size_bytes: float) -> float:
    """hivemind's butterfly all-reduce: reduce-scatter then all-gather of size/n parts, all pairs at once.

    In each phase every member sends one part to every other member in parallel; a phase lasts as
    long as its slowest member needs (its slowest link's latency plus its sends, which queue on a
    shared uplink on the ``home`` network).
    """
    n = len(members)
    if n <= 1:
        return 0.0
    part = size_bytes / n
    shared = net.spec.kind == "home"
    phase = 0.0
    for a in members:
        latency = sending = 0.0
        for b in members:
            if a == b:
                continue
            link_latency, bandwidth = net.link(a, b)
            latency = max(latency, link_latency)
            sending = sending + part / bandwidth if shared else max(sending, part / bandwidth)
        phase = max(phase, latency + sending)
    return 2 * phase


class Iterations:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.engine = sim.engine
        scenario = sim.scenario
        self.dhs = sorted(p.node_id for p in sim.trace.initial if p.is_data_holder)
        self.per_dh = scenario.microbatches_per_dh
        self.n_stages = scenario.n_stages
        self.grad_bytes = [GRAD_BYTES_PER_PARAM * stage_param_count(sim.model, s, scenario.n_stages)
                           for s in range(scenario.n_stages + 1)]
        self.iteration = 0
        self.started_s = 0.0
        self.queues: dict[str, deque[Microbatch]] = {dh: deque() for dh in self.dhs}
        self.remaining = dict.fromkeys(self.dhs, 0)
        self.aggregating = False
        self.pending: set[int] = set()
        self.members: dict[int, list[str]] = {}
        self.tokens: dict[int, int] = dict.fromkeys(range(scenario.n_stages + 1), 0)
        self.ready: list[SimNode] = []
        self._allreduce_s: dict[tuple[int, tuple[str, ...]], float] = {}
        self.finished = False

    def start(self) -> None:
        self._start_iteration()

    def _start_iteration(self) -> None:
        self.iteration += 1
        self.started_s = self.engine.now
        for dh in self.dhs:
            for index in range(self.per_dh):
                self.queues[dh].append(Microbatch(f"{dh}/{self.iteration}/{index}", dh, self.iteration,
                                                  self.n_stages))
            self.remaining[dh] = self.per_dh
        self.sim.router.on_iteration_start()
        self.try_dispatch()

    def try_dispatch(self) -> None:
        """Send every queued microbatch the router admits now."""
        router, dispatch = self.sim.router, self.sim.dataplane.dispatch
        for dh in self.dhs:
            queue = self.queues[dh]
            while queue and router.can_dispatch(dh):
                dispatch(queue.popleft())

    def on_complete(self, m: Microbatch) -> None:
        self.remaining[m.dh] -= 1
        if self.sim.metrics.reached_target():
            self.finished = True
            self.engine.stop()
            return
        if any(self.remaining.values()):
            if not self.remaining[m.dh]:
                self.sim.router.on_holder_idle(m.dh)
            self.try_dispatch()
        else:
            self._aggregate()

    # -- aggregation -----------------------------------------------------------------------
    def _aggregate(self) -> None:
        self.aggregating = True
        self.pending = set(range(self.n_stages + 1))
        for stage in range(self.n_stages + 1):
            self._start_allreduce(stage)

    def _live_members(self, stage: int) -> list[str]:
        if stage == 0:
            return list(self.dhs)
        return list(self.sim.cluster.active_by_stage[stage])

    def _start_allreduce(self, stage: int) -> None:
        members = self._live_members(stage)
        self.tokens[stage] += 1
        self.members[stage] = members
        key = (stage, tuple(members))
        duration = self._allreduce_s.get(key)
        if duration is None:
            duration = self._allreduce_s[key] = butterfly_allreduce_s(self.sim.network, members,
                                                                      self.grad_bytes[stage])
        self.engine.at(self.engine.now + duration, self._allreduce_done, stage, self.tokens[stage])

    def _allreduce_done(self, stage: int, token: int) -> None:
        if token != self.tokens[stage] or stage not in self.pending:
            return
        self.pending.discard(stage)
        if not self.pending:
            self._end_iteration()

    def aggregating_with(self, node: SimNode) -> bool:
        return (self.aggregating and node.stage in self.pending
                and node.node_id in self.members.get(node.stage, ()))

    def on_crash(self, node: SimNode) -> None:
        """A replica died: if it was in a running all-reduce, restart that reduction without it."""
        if not self.aggregating_with(node):
            return
        self.tokens[node.stage] += 1
        detect_s = self.sim.scenario.dataplane.allreduce_failure_detect_s
        self.sim.metrics.allreduce_restarts += 1
        self.engine.at(self.engine.now + detect_s, self._restart, node.stage, self.tokens[node.stage])

    def _restart(self, stage: int, token: int) -> None:
        if token == self.tokens[stage] and stage in self.pending:
            self._start_allreduce(stage)

    def _end_iteration(self) -> None:
        self.sim.metrics.on_iteration(self.iteration, self.started_s, self.engine.now)
        for node in self.sim.cluster.nodes.values():
            node.iteration_compute_s = 0.0
        self.aggregating = False
        ready, self.ready = self.ready, []
        for node in ready:
            if node.alive:
                self.sim.activate(node)
        self._start_iteration()
