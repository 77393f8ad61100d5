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
from typing import Protocol

from gwtfp2p.sim.allreduce import Reductions
from gwtfp2p.sim.churn import Trace
from gwtfp2p.sim.cluster import Cluster, SimNode
from gwtfp2p.sim.compute import ModelSpec, stage_param_count
from gwtfp2p.sim.dataplane import DataPlane
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.metrics import Metrics
from gwtfp2p.sim.microbatch import Microbatch
from gwtfp2p.sim.network import Network
from gwtfp2p.sim.params import Scenario
from gwtfp2p.sim.routers.base import Router


class IterationsHost(Protocol):
    """What the iterations use of the run."""

    engine: Engine
    scenario: Scenario
    model: ModelSpec
    network: Network
    cluster: Cluster
    trace: Trace
    router: Router
    dataplane: DataPlane
    metrics: Metrics

    def activate(self, node: SimNode) -> None:
        """``node`` starts serving."""


class Iterations:
    def __init__(self, sim: IterationsHost) -> None:
        self.sim = sim
        self.engine = sim.engine
        scenario = sim.scenario
        self.dhs = sorted(p.node_id for p in sim.trace.initial if p.is_data_holder)
        self.per_dh = scenario.microbatches_per_dh
        self.n_stages = scenario.n_stages
        self.grad_bytes = [sim.model.grad_bytes(stage_param_count(sim.model, s, scenario.n_stages))
                           for s in range(scenario.n_stages + 1)]
        self.iteration = 0
        self.started_s = 0.0
        self.queues: dict[str, deque[Microbatch]] = {dh: deque() for dh in self.dhs}
        self.remaining = dict.fromkeys(self.dhs, 0)
        self.aggregating = False
        self.reductions = Reductions(sim.engine, sim.network, self.grad_bytes,
                                     scenario.dataplane.allreduce_failure_detect_s, self._live_members,
                                     self._allreduce_done)
        self.ready: list[SimNode] = []
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
        self.sim.metrics.on_aggregation(self.iteration, self.engine.now)
        for stage in range(self.n_stages + 1):
            self.reductions.start(stage)

    def _live_members(self, stage: int) -> list[str]:
        if stage == 0:
            return list(self.dhs)
        return list(self.sim.cluster.active_by_stage[stage])

    def _allreduce_done(self, stage: int) -> None:
        if not self.reductions.running:
            self._end_iteration()

    def aggregating_with(self, node: SimNode) -> bool:
        return self.aggregating and self.reductions.involves(node)

    def on_crash(self, node: SimNode) -> None:
        """A replica died: if it was in a running all-reduce, restart that reduction without it."""
        if self.aggregating and self.reductions.on_crash(node):
            self.sim.metrics.allreduce_restarts += 1

    def admit(self, node: SimNode) -> None:
        """A joiner has its state: it serves now, or after the step if an aggregation is running."""
        if self.aggregating:
            self.ready.append(node)
        else:
            self.sim.activate(node)

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
