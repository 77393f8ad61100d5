"""What the parts of one simulated run see of each other: narrow, structural interfaces.

The run (``simulation.Simulation``) builds the engine, cluster, network, router, data plane,
recovery, iterations and membership, and hands itself to each part typed as the narrow host
that part declares. The parts call each other both ways (the data plane reports losses to
recovery, recovery resends through the data plane), so the interfaces that would otherwise close
an import circle live here, importing only the leaf modules. Owns no behaviour.
"""

from __future__ import annotations

from typing import Protocol

from gwtfp2p.flow.instance import FlowInstance
from gwtfp2p.flow.load import NodeResources
from gwtfp2p.sim.churn import Crash
from gwtfp2p.sim.cluster import Cluster, SimNode
from gwtfp2p.sim.compute import ModelSpec
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.microbatch import Microbatch
from gwtfp2p.sim.network import Network
from gwtfp2p.sim.params import Scenario


class IterationsView(Protocol):
    """What a router reads of the data holders' iterations."""

    dhs: list[str]
    remaining: dict[str, int]

    def try_dispatch(self) -> None:
        """Send every queued microbatch the router admits now."""


class RouterHost(Protocol):
    """What a router sees of the run: the shared models, the iterations and the edge costs."""

    engine: Engine
    cluster: Cluster
    network: Network
    scenario: Scenario
    model: ModelSpec
    seed: int
    iterations: IterationsView

    def edge_cost(self, a: str, b: str) -> float:
        """The paper's d(a, b) in seconds for one microbatch."""

    def flow_instance(self, idle_holders: frozenset[str] = frozenset()) -> FlowInstance:
        """The live, active swarm as a flow instance."""

    def resources_of(self, node: SimNode) -> NodeResources:
        """GPU and uplink seconds per unit of ``node``."""


class LossHandler(Protocol):
    """Where the data plane reports a message lost with its dead receiver."""

    def send_failed(self, m: Microbatch, pos: int, kind: int, sender: str, dead: str, sent_s: float) -> None:
        """A message for the dead holder of ``pos`` was lost."""


class CrashHandler(Protocol):
    """Where membership hands a crash of the trace."""

    def on_crash(self, node: SimNode, event: Crash) -> None:
        """``node`` dies now."""


class JoinGate(Protocol):
    """Who decides when a joiner that has downloaded its stage's state starts serving."""

    def admit(self, node: SimNode) -> None:
        """``node`` has its state: activate it now or once a running step is taken."""


class CompletionSink(Protocol):
    """Who hears that a microbatch's backward reached its data holder."""

    def on_complete(self, m: Microbatch) -> None:
        """``m`` is trained."""


class CrashWatcher(Protocol):
    """What recovery asks the iterations about a crash (a running all-reduce)."""

    def aggregating_with(self, node: SimNode) -> bool:
        """Whether ``node`` is in a running all-reduce."""

    def on_crash(self, node: SimNode) -> None:
        """``node`` died: restart a reduction it was part of."""
