"""Per-stage all-reduces in simulated time: hivemind's butterfly, restarted without a dead member.

A stage's live replicas (the data holders for stage 0: head and tail) average their gradients with
hivemind's butterfly all-reduce, which SWARM and our daemon both use: a reduce-scatter and an
all-gather of size/n parts, every pair at once. A member dying mid-reduction is noticed after the
averager's timeout and the reduction restarts with the survivors. Used by the iteration barrier
(every stage at once) and by SWARM's per-stage steps (one stage at a time). Owns no scheduling
policy: callers say when a stage starts and hear when it is done.
"""

from __future__ import annotations

from collections.abc import Callable

from gwtfp2p.sim.cluster import SimNode
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.network import Network


def butterfly_allreduce_s(net: Network, members: list[str], size_bytes: float) -> float:
    """hivemind's butterfly all-reduce: reduce-scatter then all-gather of size/n parts, all pairs at once.

    In each phase every member sends one part to every other member in parallel; a phase lasts as
    long as its slowest member needs (its slowest link's latency plus its sends, which queue on a
    shared uplink on the ``home`` and ``lab`` networks).
    """
    n = len(members)
    if n <= 1:
        return 0.0
    part = size_bytes / n
    shared = net.spec.shared_uplink
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


class Reductions:
    """The stages whose all-reduce is running, their members, and restarts after a death."""

    def __init__(self, engine: Engine, network: Network, grad_bytes: list[float], failure_detect_s: float,
                 live_members: Callable[[int], list[str]], on_done: Callable[[int], None]) -> None:
        self.engine = engine
        self.network = network
        self.grad_bytes = grad_bytes  # per stage, what each member sends in all
        self.failure_detect_s = failure_detect_s
        self.live_members = live_members
        self.on_done = on_done
        self.running: set[int] = set()
        self.members: dict[int, list[str]] = {}
        self.tokens: dict[int, int] = dict.fromkeys(range(len(grad_bytes)), 0)
        self._duration_s: dict[tuple[int, tuple[str, ...]], float] = {}

    def start(self, stage: int) -> None:
        """Reduce ``stage`` among its live members now."""
        self.running.add(stage)
        members = self.live_members(stage)
        self.tokens[stage] += 1
        self.members[stage] = members
        key = (stage, tuple(members))
        duration = self._duration_s.get(key)
        if duration is None:
            duration = self._duration_s[key] = butterfly_allreduce_s(self.network, members, self.grad_bytes[stage])
        self.engine.at(self.engine.now + duration, self._done, stage, self.tokens[stage])

    def _done(self, stage: int, token: int) -> None:
        if token != self.tokens[stage] or stage not in self.running:
            return
        self.running.discard(stage)
        self.on_done(stage)

    def involves(self, node: SimNode) -> bool:
        return node.stage in self.running and node.node_id in self.members.get(node.stage, ())

    def on_crash(self, node: SimNode) -> bool:
        """A member died: restart its stage's reduction without it after the timeout (True if so)."""
        if not self.involves(node):
            return False
        self.tokens[node.stage] += 1
        self.engine.at(self.engine.now + self.failure_detect_s, self._restart, node.stage, self.tokens[node.stage])
        return True

    def _restart(self, stage: int, token: int) -> None:
        if token == self.tokens[stage] and stage in self.running:
            self.start(stage)
