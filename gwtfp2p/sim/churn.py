"""Churn traces: the initial swarm and seeded crash and join processes, identical for every router.

A trace depends only on the scenario and the seed. Crashes form a Poisson process whose rate is
the churn (% of the live relays per hour); joins a Poisson process at the join rate (% of the
initial relays per hour). A victim is drawn uniformly among live relays whose stage keeps at
least ``min_replicas_after_crash`` established members (initial ones, or joined 10 minutes ago);
a joiner takes the bottleneck stage (least total memory slots, as ``--stage auto`` does) at a
random location with a GPU drawn like the others. Data holders do not crash. Each crash carries a
uniform draw that places it within the liveness period.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from gwtfp2p.flow.geo import geo10
from gwtfp2p.sim.compute import HETEROGENEOUS_GPUS, HOMOGENEOUS_GPU
from gwtfp2p.sim.params import Scenario

ESTABLISHED_S = 600.0  # a joiner counts towards a stage's guaranteed replicas after this long


@dataclass(frozen=True)
class NodePlan:
    """A node as the trace creates it: where it is, what it serves, on which GPU."""

    node_id: str
    stage: int
    location: str
    gpu: str
    access: tuple[float, float] = (0.0, 0.0)  # home broadband (uplink, downlink) bytes/s

    @property
    def is_data_holder(self) -> bool:
        return self.stage == 0


@dataclass(frozen=True)
class Crash:
    time_s: float
    node_id: str
    phase_u: float  # where in its liveness period the node died, U[0, 1)


@dataclass(frozen=True)
class Join:
    time_s: float
    node: NodePlan


@dataclass(frozen=True)
class Trace:
    initial: tuple[NodePlan, ...]
    events: tuple[Crash | Join, ...]

    @property
    def crashes(self) -> list[Crash]:
        return [e for e in self.events if isinstance(e, Crash)]

    @property
    def joins(self) -> list[Join]:
        return [e for e in self.events if isinstance(e, Join)]


def _plan(rng: random.Random, scenario: Scenario, node_id: str, stage: int) -> NodePlan:
    location = rng.choice(geo10().locations)
    gpu = HOMOGENEOUS_GPU if scenario.compute == "homogeneous" else rng.choice(HETEROGENEOUS_GPUS)
    return NodePlan(node_id, stage, location, gpu, scenario.network.draw_access(rng))


def initial_nodes(scenario: Scenario, rng: random.Random) -> list[NodePlan]:
    nodes = [_plan(rng, scenario, f"dh{d}", 0) for d in range(scenario.data_holders)]
    for stage in range(1, scenario.n_stages + 1):
        nodes += [_plan(rng, scenario, f"s{stage}r{r}", stage) for r in range(scenario.relays_per_stage)]
    return nodes


def trace_key(scenario: Scenario, seed: int) -> str:
    """What a trace depends on: scenarios differing only in other ways share their traces (a longer
    horizon only extends the same trace)."""
    return (f"trace:{scenario.network.kind}:{scenario.compute}:{scenario.n_stages}x{scenario.relays_per_stage}:"
            f"{scenario.data_holders}:{scenario.churn_pct_per_hour:g}:{scenario.join_rate_pct_per_hour:g}:"
            f"{scenario.min_replicas_after_crash}:{seed}")


def make_trace(scenario: Scenario, seed: int, slots_of: Callable[[NodePlan], int]) -> Trace:
    """The trace of ``scenario`` for ``seed`` (same inputs, same trace)."""
    rng = random.Random(trace_key(scenario, seed))
    initial = initial_nodes(scenario, rng)
    members: dict[str, NodePlan] = {n.node_id: n for n in initial if not n.is_data_holder}
    joined_at: dict[str, float] = dict.fromkeys(members, -ESTABLISHED_S)
    crash_per_s = scenario.churn_pct_per_hour / 100.0 / 3600.0
    join_per_s = scenario.join_rate_pct_per_hour / 100.0 / 3600.0 * len(members)
    events: list[Crash | Join] = []
    now, joined = 0.0, 0
    next_join = now + rng.expovariate(join_per_s) if join_per_s > 0 else float("inf")
    while True:
        rate = crash_per_s * len(members)
        next_crash = now + rng.expovariate(rate) if rate > 0 else float("inf")
        now = min(next_crash, next_join)
        if now >= scenario.horizon_s:
            break
        if now == next_join:
            joined += 1
            stage = _bottleneck(members.values(), scenario.n_stages, slots_of)
            plan = _plan(rng, scenario, f"j{joined}s{stage}", stage)
            members[plan.node_id] = plan
            joined_at[plan.node_id] = now
            events.append(Join(now, plan))
            next_join = now + rng.expovariate(join_per_s)
            continue
        established = {k for k, t in joined_at.items() if k in members and now - t >= ESTABLISHED_S}
        victim = _victim(rng, members, established, scenario.min_replicas_after_crash)
        if victim is not None:
            del members[victim]
            events.append(Crash(now, victim, rng.random()))
    return Trace(tuple(initial), tuple(events))


def _bottleneck(members, n_stages: int, slots_of: Callable[[NodePlan], int]) -> int:
    total = dict.fromkeys(range(1, n_stages + 1), 0)
    for plan in members:
        total[plan.stage] += slots_of(plan)
    return min(total, key=lambda s: (total[s], s))


def _victim(rng: random.Random, members: dict[str, NodePlan], established: set[str], keep: int) -> str | None:
    """Any live relay, unless its stage would keep fewer than ``keep`` established members."""
    per_stage: dict[int, int] = {}
    for node_id in established:
        stage = members[node_id].stage
        per_stage[stage] = per_stage.get(stage, 0) + 1
    eligible = sorted(k for k, p in members.items()
                      if per_stage.get(p.stage, 0) - (1 if k in established else 0) >= keep)
    return rng.choice(eligible) if eligible else None
