"""The ``oracle`` router: centralized min-cost max-flow, re-solved instantly after every change.

It knows everything at once (crashes included) and pays no control-plane cost: at the start,
at every crash and at every activation it solves the live swarm's flow instance exactly
(``gwtfp2p.flow.oracle.solve``). Each solved path is one flow unit; a data holder sends one
microbatch per free path and the microbatch follows that path. A hop whose path broke uses a
current path through the same node (least used), else the cheapest live next-stage replica.
Maximum flow may leave a holder with no path when capacity is short; once the other holders are
done with the iteration, it re-solves for that one. Recovery follows docs/design.md §3 with zero
detection delay.
"""

from __future__ import annotations

import itertools
from collections import Counter

from gwtfp2p.flow.oracle import solve
from gwtfp2p.sim.microbatch import Microbatch
from gwtfp2p.sim.ports import RouterHost
from gwtfp2p.sim.routers.base import Router

Path = tuple[str, ...]


class OracleRouter(Router):
    name = "oracle"

    def __init__(self, sim: RouterHost) -> None:
        super().__init__(sim)
        self.paths: dict[str, list[Path]] = {}
        self.multiplicity: Counter[Path] = Counter()  # units solved on each distinct path
        self.usage: Counter[Path] = Counter()  # microbatches in flight on each path
        self.in_flight: Counter[str] = Counter()
        self.idle: frozenset[str] = frozenset()  # holders done with this iteration, left out of the solve
        self.solves = 0

    def start(self) -> None:
        self._solve()

    def on_holder_idle(self, dh: str) -> None:
        """Max flow may leave a holder without any path; once others are done, give it their share."""
        remaining = self.sim.iterations.remaining
        if any(remaining[h] and not self.paths.get(h) for h in remaining):
            self._solve()

    def on_iteration_start(self) -> None:
        if self.idle:
            self.idle = frozenset()
            self._solve()

    def on_crash(self, node_id: str, phase_u: float) -> None:
        self._solve()

    def on_activate(self, node_id: str) -> None:
        self._solve()

    def _solve(self) -> None:
        remaining = self.sim.iterations.remaining
        busy = any(remaining.values())
        self.idle = frozenset(h for h, n in remaining.items() if busy and not n)
        instance = self.sim.flow_instance(self.idle)
        if not instance.edge_costs:  # a stage without replicas: nothing can be routed
            self.paths, self.multiplicity = {dh: [] for dh in self.sim.iterations.dhs}, Counter()
            return
        result = solve(instance)
        self.solves += 1
        self.install(result.paths)

    def install(self, routing: list[Path]) -> None:
        """Route by ``routing`` (one path per unit): each holder's paths, cheapest first."""
        paths: dict[str, list[Path]] = {dh: [] for dh in self.sim.iterations.dhs}
        cost = self.sim.edge_cost
        for path in sorted(routing, key=lambda p: (sum(cost(a, b) for a, b in itertools.pairwise(p)), p)):
            paths[path[0]].append(path)
        self.paths = paths
        self.multiplicity = Counter(routing)

    # -- routing -----------------------------------------------------------------------------------
    def _free_path(self, dh: str) -> Path | None:
        for path in self.paths.get(dh, ()):
            if self.usage[path] < self.multiplicity[path]:
                return path
        return None

    def can_dispatch(self, dh: str) -> bool:
        return self.in_flight[dh] < len(self.paths.get(dh, ())) and self._free_path(dh) is not None

    def first_hop(self, dh: str, m: Microbatch) -> tuple[str, object]:
        path = self._free_path(dh)
        self.usage[path] += 1
        self.in_flight[dh] += 1
        m.unit = path
        return path[1], path

    def release(self, dh: str, m: Microbatch) -> None:
        self.in_flight[dh] -= 1
        if m.unit is not None:
            self.usage[m.unit] -= 1
            if self.usage[m.unit] <= 0:
                del self.usage[m.unit]

    def next_hop(self, node_id: str, m: Microbatch, pos: int) -> tuple[str, object]:
        path = m.tag[pos - 1]
        if isinstance(path, tuple) and path[pos - 1] == node_id and self.nodes[path[pos]].alive:
            return path[pos], path
        return self._reroute(node_id, m, pos, None)

    def replacement(self, sender: str, m: Microbatch, pos: int, dead: str) -> str | None:
        return self._reroute(sender, m, pos, dead)[0]

    def _reroute(self, node_id: str, m: Microbatch, pos: int, exclude: str | None) -> tuple[str | None, object]:
        through = [p for p in self.paths.get(m.dh, ()) if p[pos - 1] == node_id and p[pos] != exclude
                   and self.nodes[p[pos]].alive]
        if through:
            path = min(through, key=lambda p: (self.usage[p] - self.multiplicity[p], p))
            return path[pos], path
        return self.cheapest(node_id, pos, exclude), None
