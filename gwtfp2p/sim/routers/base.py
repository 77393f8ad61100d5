"""The router interface the data plane calls, with the defaults every router shares.

A router decides where a data holder's microbatch goes first, where each hop sends it next, which
replica takes over a lost hop, how soon a failure is detected and what it learns from completed
hops. Routing and recovery are all that differ between ``gwtf``, ``swarm`` and ``oracle``; the
network, compute, churn trace and data plane are the same for all three.
"""

from __future__ import annotations

from gwtfp2p.sim.microbatch import Microbatch
from gwtfp2p.sim.ports import RouterHost


class Router:
    name = "base"
    recover_through_dead_upstream = True  # False: a dead upstream's own recovery redoes the hop (GWTF)

    def __init__(self, sim: RouterHost) -> None:
        self.sim = sim
        self.engine = sim.engine
        self.nodes = sim.cluster.nodes
        self.control_messages = 0

    # -- life cycle --------------------------------------------------------------------------
    def start(self) -> None:
        """The initial members are active; build whatever routing state the router needs."""

    def on_crash(self, node_id: str, phase_u: float) -> None:
        """Ground truth: ``node_id`` died now (a router may only act on it when it would know)."""

    def on_activate(self, node_id: str) -> None:
        """A joiner starts serving (after its download, at an iteration boundary)."""

    def on_iteration_start(self) -> None:
        """A new iteration: every data holder wants its microbatches again."""

    def on_holder_idle(self, dh: str) -> None:
        """``dh`` has all of this iteration's microbatches back (others may still be working)."""

    # -- admission and routing -----------------------------------------------------------------
    def can_dispatch(self, dh: str) -> bool:
        return True

    def first_hop(self, dh: str, m: Microbatch) -> tuple[str, object]:
        raise NotImplementedError

    def release(self, dh: str, m: Microbatch) -> None:
        """``m`` completed: its flow unit (if any) is free again."""

    def next_hop(self, node_id: str, m: Microbatch, pos: int) -> tuple[str, object]:
        raise NotImplementedError

    def replacement(self, sender: str, m: Microbatch, pos: int, dead: str) -> str | None:
        raise NotImplementedError

    def believes_alive(self, observer: str, node_id: str) -> bool:
        return self.nodes[node_id].alive

    # -- failure detection -----------------------------------------------------------------------
    def holder_crash_detect(self, m: Microbatch, pos: int, dead: str, crash_s: float,
                            phase_u: float) -> float | None:
        """When the upstream of a lost position learns of the loss (None: only through a failed send)."""
        return crash_s

    def send_failure_detect(self, m: Microbatch, pos: int, kind: int, sender: str, dead: str,
                            sent_s: float) -> float:
        """When the sender of a message lost with a dead receiver notices."""
        return self.engine.now

    def backward_failure_notify_s(self, downstream: str, upstream: str) -> float:
        """Delay before the upstream hop hears that its downstream could not deliver a gradient."""
        return 0.0

    def on_failure_detected(self, m: Microbatch, observer: str, dead: str) -> None:
        """``observer`` has found ``dead`` dead while handling ``m``."""

    # -- observations -----------------------------------------------------------------------------
    def on_transfer(self, sender: str, receiver: str, size_bytes: float, requested_s: float) -> None:
        """An activation or gradient sent at ``requested_s`` reached its live receiver now."""

    def seen_cost(self, observer: str, candidate: str) -> float:
        """d(observer, candidate) as ``observer`` knows it (exact unless the router measures)."""
        return self.sim.edge_cost(observer, candidate)

    # -- helpers -------------------------------------------------------------------------------
    def cheapest(self, sender: str, stage: int, exclude: str | None = None,
                 observer: str | None = None) -> str | None:
        """The active replica of ``stage`` with the lowest edge cost from ``sender`` (believed alive)."""
        observer = observer or sender
        best, best_cost = None, 0.0
        for candidate in self.sim.cluster.active_by_stage[stage]:
            if candidate == exclude or not self.believes_alive(observer, candidate):
                continue
            cost = self.seen_cost(sender, candidate)
            if best is None or cost < best_cost:
                best, best_cost = candidate, cost
        return best
