"""SWARM's trainers: sequential processes, one request in flight each, retried until one succeeds.

Citations are ``yandex-research/swarm <path>:<line>``; C = ``swarm/pipeline/src/moe/client``,
S = ``swarm/pipeline/src/moe/server``.

* A trainer process runs one microbatch at a time through the stages (``TrainerModel.forward``,
  yandex-research/swarm swarm/train_pipeline.py:47-55; batch 1 per process,
  swarm/setup_and_launch_trainer.sh:21-25), then its backward in reverse order (autograd). Each
  stage call, forward and backward alike, picks its server from the trainer's own heap for that
  stage (C/balanced_expert.py:119-128, 143-152): forward tasks cost the batch size, backward tasks
  2.5 times that (C/balanced_expert.py:65, 75).
* Servers are stateless (S/expert_backend.py:104-124: the forward keeps nothing; 126-176: the
  backward runs the forward again, then the backward). A backward request carries the stage's
  input and the gradient of its output (C/balanced_expert.py:137-142); it may go to any replica.
  Compute per microbatch and stage is forward + (forward + backward), and no activation memory is
  held between requests (one microbatch's activations during a backward, which every GPU fits).
* A request that times out (30 s forward, 75 s backward, swarm/train_pipeline.py:21-22) is retried
  on the next heap pick without a ban (C/balancer.py:135-138); one that fails with an error (a
  refused or reset connection) bans its server until its record expires, then is retried
  (C/balancer.py:139-144). A late answer of an abandoned request is discarded (its compute is wasted).

Deviation, in SWARM's favour: a server's output goes straight to the server the trainer picks for
the next call (hop to hop, as gwtf's data plane), not back through the trainer; the trainer still
holds every tensor it would have received, so a retried request and a backward's input are sent
by the trainer (its data holder). The trainer's loss (the tail) runs on its data holder's GPU.
"""

from __future__ import annotations

import random
from typing import Protocol

from gwtfp2p.sim.cluster import BACKWARD, LOSS, STATELESS_FORWARD, Cluster, SimNode
from gwtfp2p.sim.compute import ModelSpec
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.metrics import Metrics
from gwtfp2p.sim.microbatch import Microbatch
from gwtfp2p.sim.network import Network
from gwtfp2p.sim.params import Scenario
from gwtfp2p.sim.swarm.balancer import Balancer
from gwtfp2p.sim.swarm.discovery import Records

FWD, BWD, TO_LOSS, TO_DONE = "forward", "backward", "to-loss", "to-done"


class Call:
    """A trainer's request in flight: which stage, which server, since when, what it waits for."""

    __slots__ = ("chain_lost", "kind", "number", "previous", "sent_s", "server", "source", "source_depart",
                 "stage", "waiting")

    def __init__(self, kind: str, stage: int, server: str, sent_s: float, number: int) -> None:
        self.kind = kind
        self.stage = stage
        self.server = server
        self.sent_s = sent_s
        self.number = number
        self.waiting = 0  # inputs not arrived yet
        self.source: str | None = None  # the previous call's server, handing its output on directly
        self.source_depart = 0.0
        self.previous: tuple[str, int] | None = None  # (kind, stage) of that call
        self.chain_lost = False  # that output was lost with its server: the previous call is redone


class Trainer:
    """One trainer process: its data holder, its own heaps and the microbatch it works on."""

    __slots__ = ("balancers", "call", "dh", "m", "name")

    def __init__(self, name: str, dh: str, balancers: list[Balancer | None]) -> None:
        self.name = name
        self.dh = dh
        self.balancers = balancers
        self.m: Microbatch | None = None
        self.call: Call | None = None


class TrainersHost(Protocol):
    """What the trainers use of the run."""

    engine: Engine
    network: Network
    cluster: Cluster
    model: ModelSpec
    scenario: Scenario
    metrics: Metrics


class Schedule(Protocol):
    """Where microbatches come from and where trained ones are counted (the steps)."""

    def next_microbatch(self, dh: str) -> Microbatch | None:
        """The data holder's next microbatch (None: wait for the next iteration)."""

    def on_complete(self, m: Microbatch) -> None:
        """``m`` is trained."""

    def on_backward_done(self, node: SimNode) -> None:
        """``node`` applied one microbatch's gradient."""


class Trainers:
    """All trainer processes of a run and their request loop."""

    def __init__(self, host: TrainersHost, records: Records, schedule: Schedule, rng: random.Random) -> None:
        self.host = host
        self.engine = host.engine
        self.net = host.network
        self.cluster = host.cluster
        self.nodes = host.cluster.nodes
        self.records = records
        self.schedule = schedule
        self.rng = rng
        scenario = host.scenario
        self.params = scenario.swarm
        self.refused = scenario.dataplane.crash_mode == "refused"
        self.n_stages = scenario.n_stages
        self.size = host.model.activation_bytes
        self.task = {FWD: float(host.model.microbatch),
                     BWD: host.model.microbatch * self.params.backward_task_multiplier}
        self.timeout = {FWD: self.params.forward_timeout_s, BWD: self.params.backward_timeout_s,
                        TO_LOSS: self.params.forward_timeout_s, TO_DONE: self.params.backward_timeout_s}
        self.trainers: list[Trainer] = []
        self.of_microbatch: dict[str, Trainer] = {}
        self.calls = 0
        self.retries = 0
        host.cluster.on_task_done = self._task_done

    # -- processes and their heaps --------------------------------------------------------------
    def start(self, dhs: list[str]) -> None:
        per_dh = self.params.trainers_per_dh or self.host.scenario.microbatches_per_dh
        period = self.params.balancer_update_period_s
        for dh in dhs:
            for index in range(per_dh):
                balancers = [None] + [Balancer(self.params, self.rng) for _ in range(self.n_stages)]
                trainer = Trainer(f"{dh}/t{index}", dh, balancers)
                self.trainers.append(trainer)
                for stage in range(1, self.n_stages + 1):
                    self._refresh(trainer, stage)
                    self.engine.at(self.engine.now + self.rng.uniform(0.0, period), self._periodic, trainer, stage)
        self.wake()

    def wake(self) -> None:
        """Every idle trainer takes its next microbatch."""
        for trainer in self.trainers:
            if trainer.m is None:
                self._begin(trainer)

    def _refresh(self, trainer: Trainer, stage: int) -> None:
        trainer.balancers[stage].update(self.records.of_stage(stage, self.engine.now), self.engine.now)

    def _periodic(self, trainer: Trainer, stage: int) -> None:
        self._refresh(trainer, stage)
        self.engine.at(self.engine.now + self.params.balancer_update_period_s, self._periodic, trainer, stage)

    def _choose(self, trainer: Trainer, stage: int, task_size: float) -> str:
        balancer = trainer.balancers[stage]
        now = self.engine.now
        uid = balancer.choose(task_size, now)
        if uid is None:  # the release blocks on a forced refresh (C/balancer.py:103-107)
            self._refresh(trainer, stage)
            uid = balancer.choose(task_size, now)
        if uid is None:  # no record at all (a stage without any server): take any replica
            uid = self.cluster.active_by_stage[stage][0]
        return uid

    # -- the request loop -----------------------------------------------------------------------
    def _begin(self, trainer: Trainer) -> None:
        m = self.schedule.next_microbatch(trainer.dh)
        trainer.m, trainer.call = m, None
        if m is None:
            return  # waits for the next iteration (barrier)
        self.of_microbatch[m.mb_id] = trainer
        m.dispatched_s = self.engine.now
        self._send(trainer, FWD, 1, [(trainer.dh, self.size)])

    def _send(self, trainer: Trainer, kind: str, stage: int, inputs: list[tuple[str, float]],
              previous: Call | None = None) -> None:
        """Open a call: pick its server (or the data holder), send its inputs, arm its timeout."""
        now = self.engine.now
        if kind in (TO_LOSS, TO_DONE):
            server = trainer.dh
        elif kind == BWD and self.params.backward_to_forward_server:  # an ablation, not SWARM
            server = trainer.m.holder[stage]
        else:
            server = self._choose(trainer, stage, self.task[kind])
        self.calls += 1
        call = Call(kind, stage, server, now, self.calls)
        call.waiting = len(inputs)
        trainer.call = call
        if kind == FWD:
            trainer.m.holder[stage] = server
        self.engine.at(now + self.timeout[kind], self._timed_out, trainer, call.number)
        if self.refused and not self.nodes[server].alive:  # the connection is refused: nothing is sent
            self.engine.at(now + self.net.round_trip_s(trainer.dh, server), self._failed, trainer, call.number,
                           kind, stage, server)
            return
        for src, size in inputs:
            _, depart, arrive = self.net.transfer(src, server, size, now)
            chained = previous is not None and src == previous.server
            if chained:
                call.source, call.source_depart, call.previous = src, depart, (previous.kind, previous.stage)
            self.engine.at(arrive, self._arrived, trainer, call.number, src, depart,
                           previous if chained else None)

    def _arrived(self, trainer: Trainer, number: int, src: str, depart: float, previous: Call | None) -> None:
        call = trainer.call
        current = call is not None and call.number == number
        if self.nodes[src].died_s < depart:  # lost with its sender
            if current and previous is not None:
                call.chain_lost = True
            return
        if previous is not None and previous.kind in (FWD, BWD):  # the previous call has answered
            trainer.balancers[previous.stage].observe(previous.server, self.task[previous.kind],
                                                      self.engine.now - previous.sent_s)
        if not current or not self.nodes[call.server].alive:
            return  # stale, or its server is gone: the timeout (or the refusal) will tell
        call.waiting -= 1
        if call.waiting == 0:
            self._compute(trainer, call)

    def _compute(self, trainer: Trainer, call: Call) -> None:
        m, node = trainer.m, self.nodes[call.server]
        if call.kind == FWD:
            task = (STATELESS_FORWARD, m, call.stage, call.number, node.forward_s)
        elif call.kind == BWD:  # recompute the forward, then the backward
            recompute_s = node.forward_s if self.params.recompute else 0.0
            task = (BACKWARD, m, call.stage, call.number, recompute_s + node.backward_s)
        elif call.kind == TO_LOSS:
            task = (LOSS, m, call.stage, call.number, node.forward_s + node.backward_s)
        else:
            self._complete(trainer)
            return
        self.cluster.submit(node, task)

    def _task_done(self, node: SimNode, task: tuple) -> None:
        kind, m, stage, number, duration = task
        trainer = self.of_microbatch.get(m.mb_id)
        call = trainer.call if trainer is not None and trainer.m is m else None
        if call is None or call.number != number:
            self.cluster.discarded_s += duration  # an abandoned request's late answer
            return
        if kind == STATELESS_FORWARD:
            if stage < self.n_stages:
                self._send(trainer, FWD, stage + 1, [(node.node_id, self.size)], call)
            else:
                self._send(trainer, TO_LOSS, stage + 1, [(node.node_id, self.size)], call)
            return
        node.iteration_compute_s += duration  # a gradient, lost with the node until its stage steps
        self.schedule.on_backward_done(node)
        if kind == LOSS:  # the gradient and the saved input, both from the trainer
            self._send(trainer, BWD, self.n_stages, [(trainer.dh, 2 * self.size)])
        elif stage > 1:
            self._send(trainer, BWD, stage - 1, [(node.node_id, self.size), (trainer.dh, self.size)], call)
        else:
            self._send(trainer, TO_DONE, 0, [(node.node_id, self.size)], call)

    def _complete(self, trainer: Trainer) -> None:
        m = trainer.m
        m.done = True
        del self.of_microbatch[m.mb_id]
        self.host.metrics.on_complete(m, self.engine.now)
        if self.host.metrics.reached_target():
            self.engine.stop()
            return
        self.schedule.on_complete(m)
        self._begin(trainer)

    # -- failures -------------------------------------------------------------------------------
    def _timed_out(self, trainer: Trainer, number: int) -> None:
        call = trainer.call
        if call is None or call.number != number:
            return
        if call.chain_lost:
            self._redo(trainer, *call.previous)
        elif call.kind in (FWD, BWD):
            self._redo(trainer, call.kind, call.stage)  # no ban on a timeout

    def _failed(self, trainer: Trainer, number: int, kind: str, stage: int, server: str) -> None:
        """A refused or reset connection: ban the server, retry the call on another one."""
        call = trainer.call
        if call is None or call.number != number:
            return
        trainer.balancers[stage].ban(server, self.engine.now)
        self._redo(trainer, kind, stage)

    def _redo(self, trainer: Trainer, kind: str, stage: int) -> None:
        """Send the call again from the trainer, which holds its inputs."""
        self.retries += 1
        self.host.metrics.recoveries += 1
        size = self.size if kind == FWD else 2 * self.size
        self._send(trainer, kind, stage, [(trainer.dh, size)])

    def on_crash(self, dead: str) -> None:
        """Refused: open connections to the dead server are reset, its trainers hear it one latency later."""
        if not self.refused:
            return  # silent: only the timeouts tell
        now = self.engine.now
        for trainer in self.trainers:
            call = trainer.call
            if call is None:
                continue
            if call.server == dead and call.kind in (FWD, BWD):
                kind, stage = call.kind, call.stage
            elif call.source == dead and call.source_depart > now:
                kind, stage = call.previous
            else:
                continue
            self.engine.at(now + self.net.link(dead, trainer.dh)[0], self._failed, trainer, call.number,
                           kind, stage, dead)
