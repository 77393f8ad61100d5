"""SWARM parallelism as released (yandex-research/swarm), run on the simulator's shared models.

``SwarmTraining`` replaces the shared data plane, recovery and iteration barrier for the ``swarm``
and ``swarm-barrier`` runs: SWARM's trainers (``trainers.py``) call stateless servers picked from
their own heaps (``balancer.py``) among the servers the DHT lists (``discovery.py``), and the stages
step on their own or at the barrier (``steps.py``). The network, compute, cluster, churn trace,
joins and metrics are the same as for gwtf and the oracle.
"""

from __future__ import annotations

import random
from typing import Protocol

from gwtfp2p.sim.churn import Crash, Trace
from gwtfp2p.sim.cluster import Cluster, SimNode, crash_phase
from gwtfp2p.sim.compute import ModelSpec
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.metrics import Metrics
from gwtfp2p.sim.network import Network
from gwtfp2p.sim.params import Scenario
from gwtfp2p.sim.swarm.discovery import Records
from gwtfp2p.sim.swarm.steps import BarrierSteps, StageSteps
from gwtfp2p.sim.swarm.trainers import Trainers


class SwarmHost(Protocol):
    """What a SWARM run uses of the simulation."""

    engine: Engine
    network: Network
    cluster: Cluster
    model: ModelSpec
    scenario: Scenario
    metrics: Metrics
    trace: Trace
    seed: int

    def activate(self, node: SimNode) -> None:
        """``node`` starts serving."""


class SwarmTraining:
    """The trainers, the servers' DHT records and the stages' steps of one SWARM run."""

    control_messages = 0  # SWARM has no routing protocol: its DHT traffic is not counted

    def __init__(self, host: SwarmHost, barrier: bool) -> None:
        self.host = host
        self.name = "swarm-barrier" if barrier else "swarm"
        self.dhs = sorted(p.node_id for p in host.trace.initial if p.is_data_holder)
        self.records = Records(host.scenario.swarm, host.cluster.nodes)
        rng = random.Random(f"swarm:{host.scenario.name}:{host.seed}")
        if barrier:
            self.steps: BarrierSteps | StageSteps = BarrierSteps(host, self.dhs, wake=self._wake)
        else:
            self.steps = StageSteps(host, self.dhs)
        self.trainers = Trainers(host, self.records, self.steps, rng)

    def _wake(self) -> None:
        self.trainers.wake()

    def start(self) -> None:
        """The initial servers declare themselves; every trainer takes its first microbatch."""
        now = self.host.engine.now
        for stage in range(1, self.host.scenario.n_stages + 1):
            for node_id in self.host.cluster.active_by_stage[stage]:
                self.records.declare(node_id, now)
        self.steps.start()
        self.trainers.start(self.dhs)

    def on_activate(self, node_id: str) -> None:
        self.records.declare(node_id, self.host.engine.now)

    def admit(self, node: SimNode) -> None:
        self.steps.admit(node)

    def on_crash(self, node: SimNode, event: Crash) -> None:
        now = self.host.engine.now
        phase = crash_phase(node, self.steps.aggregating_with(node))
        lost = self.host.cluster.kill(node, now)
        self.host.metrics.on_crash(now, node.node_id, phase, lost)
        self.steps.on_crash(node)
        self.trainers.on_crash(node.node_id)
