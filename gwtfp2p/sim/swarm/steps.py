"""When SWARM's stages take their optimizer steps: each on its own, or all at a shared barrier.

Per stage (``StageSteps``, SWARM as released; yandex-research/swarm, E =
``swarm/pipeline/src/moe/server/expert_backend.py``, O = ``swarm/pipeline/src/optim/collaborative.py``):
a server's backward applies its gradient and counts its samples (E:172, 178-197); a stage steps
when its replicas together have accumulated the target batch (``CollaborativeOptimizer``,
O:35-36, 229-238) and then average with each other, which blocks their runtime (the step runs
inside the backward call, O:248-275). So here a stage whose count reaches the target pauses its replicas
(each finishes its running task), all-reduces among them and resumes; other stages and the
trainers go on, nobody waits for the whole model. The target is the scenario's global batch (the
data holders' microbatches per iteration), the same as gwtf's, so one step of every stage trains
as much as one gwtf iteration. The counting is exact and instantaneous (the release reads it from
the DHT every 0.5-30 s), in SWARM's favour.

At the barrier (``BarrierSteps``, the ``swarm-barrier`` run): each data holder's trainers share
its microbatches of the iteration; when all are back, every stage all-reduces at once, then the
next iteration starts (the shared barrier of gwtf and the oracle). Owns no routing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Protocol

from gwtfp2p.sim.allreduce import Reductions
from gwtfp2p.sim.cluster import Cluster, SimNode
from gwtfp2p.sim.compute import ModelSpec, stage_param_count
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.metrics import Metrics
from gwtfp2p.sim.microbatch import Microbatch
from gwtfp2p.sim.network import Network
from gwtfp2p.sim.params import Scenario


class StepsHost(Protocol):
    """What the steps use of the run."""

    engine: Engine
    network: Network
    cluster: Cluster
    model: ModelSpec
    scenario: Scenario
    metrics: Metrics

    def activate(self, node: SimNode) -> None:
        """``node`` starts serving."""


class _Steps(ABC):
    """What both policies share: the data holders, the reductions and joiners waiting for a step."""

    def __init__(self, host: StepsHost, dhs: list[str]) -> None:
        self.host = host
        self.engine = host.engine
        self.cluster = host.cluster
        self.dhs = dhs
        scenario = host.scenario
        self.n_stages = scenario.n_stages
        grad_bytes = [host.model.grad_bytes(stage_param_count(host.model, s, scenario.n_stages))
                      for s in range(scenario.n_stages + 1)]
        self.reductions = Reductions(host.engine, host.network, grad_bytes,
                                     scenario.dataplane.allreduce_failure_detect_s, self.live_members,
                                     self._reduced)
        self.waiting_joiners: dict[int, list[SimNode]] = {}

    def live_members(self, stage: int) -> list[str]:
        if stage == 0:
            return list(self.dhs)
        return list(self.cluster.active_by_stage[stage])

    @abstractmethod
    def _reduced(self, stage: int) -> None:
        """``stage``'s all-reduce is done."""

    @abstractmethod
    def stepping(self, stage: int) -> bool:
        """Whether ``stage`` is taking a step now (a joiner waits for its end)."""

    def aggregating_with(self, node: SimNode) -> bool:
        return self.reductions.involves(node)

    def admit(self, node: SimNode) -> None:
        """A joiner has its state: it serves now, or once its stage's running step is taken."""
        if self.stepping(node.stage):
            self.waiting_joiners.setdefault(node.stage, []).append(node)
        else:
            self.host.activate(node)

    def _activate_waiting(self, stage: int) -> None:
        for node in self.waiting_joiners.pop(stage, []):
            if node.alive:
                self.host.activate(node)

    def on_crash(self, node: SimNode) -> None:
        if self.reductions.on_crash(node):
            self.host.metrics.allreduce_restarts += 1


class StageSteps(_Steps):
    """Each stage steps alone once its replicas have the target batch; trainers never wait."""

    def __init__(self, host: StepsHost, dhs: list[str]) -> None:
        super().__init__(host, dhs)
        self.per_step = host.scenario.demand
        self.samples = [0] * (self.n_stages + 1)  # microbatches accumulated since the stage's last step
        self.pausing: dict[int, set[str]] = {}  # stage -> members still finishing their running task
        self.last_step_s = [0.0] * (self.n_stages + 1)
        self.count = 0
        host.cluster.on_paused_idle = self._paused_idle

    def start(self) -> None:
        """Nothing to prepare: a trainer takes a new microbatch whenever it is free."""

    def next_microbatch(self, dh: str) -> Microbatch:
        self.count += 1
        return Microbatch(f"{dh}/{self.count}", dh, 0, self.n_stages)

    def on_complete(self, m: Microbatch) -> None:
        """A trainer's microbatch is back; it starts its next one at once."""

    def stepping(self, stage: int) -> bool:
        return stage in self.pausing or stage in self.reductions.running

    def on_backward_done(self, node: SimNode) -> None:
        stage = node.stage
        self.samples[stage] += 1
        if self.samples[stage] >= self.per_step and not self.stepping(stage):
            self._begin(stage)

    def _begin(self, stage: int) -> None:
        busy = set()
        for node_id in self.live_members(stage):
            if not self.cluster.pause(self.cluster.nodes[node_id]):
                busy.add(node_id)
        self.pausing[stage] = busy
        if not busy:
            self._start_reduction(stage)

    def _paused_idle(self, node: SimNode) -> None:
        busy = self.pausing.get(node.stage)
        if busy is not None and node.node_id in busy:
            busy.discard(node.node_id)
            if not busy:
                self._start_reduction(node.stage)

    def _start_reduction(self, stage: int) -> None:
        del self.pausing[stage]
        self.reductions.start(stage)

    def _reduced(self, stage: int) -> None:
        now = self.engine.now
        self.host.metrics.on_stage_step(stage, self.last_step_s[stage], now)
        self.last_step_s[stage] = now
        self.samples[stage] = max(0, self.samples[stage] - self.per_step)
        for node_id in self.reductions.members[stage]:
            node = self.cluster.nodes[node_id]
            node.iteration_compute_s = 0.0  # its gradients are applied
            self.cluster.resume(node)
        self._activate_waiting(stage)
        if self.samples[stage] >= self.per_step:
            self._begin(stage)

    def on_crash(self, node: SimNode) -> None:
        super().on_crash(node)
        busy = self.pausing.get(node.stage)
        if busy is not None and node.node_id in busy:
            busy.discard(node.node_id)
            if not busy:
                self._start_reduction(node.stage)


class BarrierSteps(_Steps):
    """The shared barrier: an iteration's microbatches, then every stage all-reduces at once."""

    def __init__(self, host: StepsHost, dhs: list[str], wake: Callable[[], None]) -> None:
        super().__init__(host, dhs)
        self.wake = wake  # tell the idle trainers that a new iteration has microbatches
        self.per_dh = host.scenario.microbatches_per_dh
        self.iteration = 0
        self.started_s = 0.0
        self.queues: dict[str, deque[Microbatch]] = {dh: deque() for dh in dhs}
        self.remaining = dict.fromkeys(dhs, 0)
        self.aggregating = False

    def start(self) -> None:
        self.iteration += 1
        self.started_s = self.engine.now
        for dh in self.dhs:
            self.queues[dh].extend(Microbatch(f"{dh}/{self.iteration}/{i}", dh, self.iteration, self.n_stages)
                                   for i in range(self.per_dh))
            self.remaining[dh] = self.per_dh

    def next_microbatch(self, dh: str) -> Microbatch | None:
        queue = self.queues[dh]
        return queue.popleft() if queue else None

    def stepping(self, stage: int) -> bool:
        return self.aggregating

    def on_backward_done(self, node: SimNode) -> None:
        """Gradients accumulate until the iteration's end."""

    def on_complete(self, m: Microbatch) -> None:
        self.remaining[m.dh] -= 1
        if not any(self.remaining.values()):
            self.aggregating = True
            for stage in range(self.n_stages + 1):
                self.reductions.start(stage)

    def _reduced(self, stage: int) -> None:
        if self.reductions.running:
            return
        self.host.metrics.on_iteration(self.iteration, self.started_s, self.engine.now)
        for node in self.cluster.nodes.values():
            node.iteration_compute_s = 0.0
        self.aggregating = False
        for waiting in sorted(self.waiting_joiners):
            self._activate_waiting(waiting)
        self.start()
        self.wake()
