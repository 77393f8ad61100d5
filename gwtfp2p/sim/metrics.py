"""Run metrics: what happened during one simulated run, and its summary.

Recorded: completion time and realized path cost of every microbatch, iteration spans and when
each one's aggregation began, crashes (with what the node was doing and the compute lost with it)
and joins. The summary reports time to train the target number of microbatches, throughput,
iteration times, GPU time wasted (compute discarded by crashes: lost gradients and activations,
partial tasks, stale results), the relays' idle fraction and the mean path cost. Owns no
behaviour of the simulation.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

from gwtfp2p.sim.cluster import Cluster
from gwtfp2p.sim.engine import Engine
from gwtfp2p.sim.microbatch import Microbatch
from gwtfp2p.sim.params import Scenario


@dataclass(frozen=True)
class RunSummary:
    scenario: str
    router: str
    seed: int
    target_microbatches: int
    completed: int
    time_to_n_s: float | None  # None: the target was not reached within the horizon
    microbatches_per_s: float
    iterations: int
    mean_iteration_s: float
    median_iteration_s: float
    wasted_gpu_s: float
    wasted_gpu_s_per_crash: float
    crashes: int
    joins: int
    idle_fraction: float
    mean_path_cost_s: float
    recoveries: int
    allreduce_restarts: int
    control_messages: int
    sim_end_s: float
    events: int

    def as_dict(self) -> dict:
        return asdict(self)


class Metrics:
    def __init__(self, scenario: Scenario, engine: Engine, cluster: Cluster,
                 edge_cost: Callable[[str, str], float]) -> None:
        self.scenario = scenario
        self.engine = engine
        self.cluster = cluster
        self.edge_cost = edge_cost
        self.target = scenario.target_microbatches
        self.completions: list[float] = []
        self.path_costs: list[float] = []
        self.iterations: list[tuple[int, float, float]] = []
        self.aggregations: dict[int, float] = {}  # iteration -> when its last microbatch came back
        self.stage_steps: list[tuple[int, float, float]] = []  # SWARM: (stage, previous step, this step)
        self.crashes: list[tuple[float, str, str, float]] = []  # time, node, phase, compute lost
        self.joins: list[tuple[float, str, int]] = []
        self.recoveries = 0
        self.allreduce_restarts = 0
        self.checkpoint_restores = 0
        self.reached_s: float | None = None

    def on_complete(self, m: Microbatch, now: float) -> None:
        self.completions.append(now)
        cost = self.edge_cost
        holders = m.holder
        self.path_costs.append(sum(cost(holders[i], holders[i + 1]) for i in range(len(holders) - 1)))
        if self.reached_s is None and len(self.completions) >= self.target:
            self.reached_s = now

    def reached_target(self) -> bool:
        return self.reached_s is not None

    def on_crash(self, now: float, node_id: str, phase: str, lost_s: float) -> None:
        self.crashes.append((now, node_id, phase, lost_s))

    def on_aggregation(self, index: int, now: float) -> None:
        """Iteration ``index``'s microbatches are all back: its aggregation starts."""
        self.aggregations[index] = now

    def on_iteration(self, index: int, start_s: float, end_s: float) -> None:
        self.iterations.append((index, start_s, end_s))

    def on_stage_step(self, stage: int, previous_s: float, now: float) -> None:
        """A stage took an optimizer step on its own (SWARM), ``now - previous_s`` after its last one."""
        self.stage_steps.append((stage, previous_s, now))

    def step_spans(self) -> tuple[int, list[float]]:
        """(iterations, their durations): the barrier's iterations, or without a barrier the
        intervals between a stage's optimizer steps (all stages pooled; iterations = the fewest
        steps any stage took)."""
        if self.iterations or not self.stage_steps:
            return len(self.iterations), [e - s for _, s, e in self.iterations]
        per_stage: dict[int, int] = {}
        for stage, _, _ in self.stage_steps:
            per_stage[stage] = per_stage.get(stage, 0) + 1
        return min(per_stage.values()), [e - s for _, s, e in self.stage_steps]

    def throughput_series(self, bin_s: float | None = None) -> list[tuple[float, float]]:
        """(bin start, microbatches per second in that bin) up to the run's end (about 150 bins)."""
        end = self.engine.now
        if end <= 0:
            return []
        bin_s = bin_s or max(10.0, end / 150.0)
        bins = [0] * (int(end // bin_s) + 1)
        for t in self.completions:
            bins[min(int(t // bin_s), len(bins) - 1)] += 1
        series = []
        for i, n in enumerate(bins):
            width = min(bin_s, end - i * bin_s)
            if width > 0:
                series.append((i * bin_s, n / width))
        return series

    def wasted_gpu_s(self) -> float:
        return sum(c[3] for c in self.crashes) + self.cluster.discarded_s

    def idle_fraction(self) -> float:
        end = self.engine.now
        alive = busy = 0.0
        for node in self.cluster.nodes.values():
            if node.is_data_holder or node.born_s >= end:
                continue
            alive += max(0.0, min(node.died_s, end) - node.born_s)
            busy += node.busy_s + (end - node.task_start if node.running is not None and node.alive else 0.0)
        return 1.0 - busy / alive if alive > 0 else 0.0

    def summary(self, router: str, seed: int, control_messages: int) -> RunSummary:
        end = self.engine.now
        iterations, spans = self.step_spans()
        completed = len(self.completions)
        crashes = len(self.crashes)
        wasted = self.wasted_gpu_s()
        rate = self.target / self.reached_s if self.reached_s else (completed / end if end > 0 else 0.0)
        return RunSummary(
            scenario=self.scenario.name, router=router, seed=seed, target_microbatches=self.target,
            completed=completed, time_to_n_s=self.reached_s, microbatches_per_s=rate,
            iterations=iterations,
            mean_iteration_s=statistics.fmean(spans) if spans else 0.0,
            median_iteration_s=statistics.median(spans) if spans else 0.0,
            wasted_gpu_s=wasted, wasted_gpu_s_per_crash=wasted / crashes if crashes else 0.0,
            crashes=crashes, joins=len(self.joins), idle_fraction=self.idle_fraction(),
            mean_path_cost_s=statistics.fmean(self.path_costs) if self.path_costs else 0.0,
            recoveries=self.recoveries, allreduce_restarts=self.allreduce_restarts,
            control_messages=control_messages, sim_end_s=end,
            events=self.engine.events_run,
        )
