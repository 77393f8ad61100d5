"""Reports: medians and ranges over seeds, missed targets, the comparisons the paper makes."""

from __future__ import annotations

import pytest

from gwtfp2p.sim.metrics import RunSummary
from gwtfp2p.sim.report import comparison_table, comparisons, group, markdown_table, runs_csv, spread
from gwtfp2p.sim.simulation import RunResult

pytestmark = pytest.mark.timeout(30)


def run(router: str, seed: int, time_to_n: float | None, rate: float, cost: float = 1.0) -> RunResult:
    summary = RunSummary(scenario="s", router=router, seed=seed, target_microbatches=100, completed=100,
                         time_to_n_s=time_to_n, microbatches_per_s=rate, iterations=10, mean_iteration_s=1.0,
                         median_iteration_s=1.0, wasted_gpu_s=2.0, wasted_gpu_s_per_crash=1.0, crashes=2, joins=2,
                         idle_fraction=0.5, mean_path_cost_s=cost, recoveries=1, allreduce_restarts=0,
                         control_messages=0, sim_end_s=100.0, events=1)
    return RunResult(summary)


def test_spread_counts_a_missed_target_as_infinitely_slow():
    assert spread([3.0, 1.0, 2.0]) == spread([1.0, 2.0, 3.0])
    assert spread([3.0, 1.0, 2.0]).median == 2.0
    missed = spread([1.0, None, None])
    assert missed.median is None and missed.low == 1.0 and missed.high is None
    assert spread([1.0, 2.0, None]).median == 2.0


def test_comparisons_use_medians_over_seeds():
    results = [run("gwtf", s, 60.0 + s, 1.0 / (60 + s), 0.5) for s in range(3)]
    results += [run("swarm", s, 100.0 + s, 1.0 / (100 + s), 1.5) for s in range(3)]
    results += [run("oracle", s, 55.0, 1.0 / 55, 0.5) for s in range(3)]
    c = comparisons(group(results)["s"])
    assert c["gwtf_time_reduction_vs_swarm"] == pytest.approx(1 - 61 / 101)
    assert c["gwtf_throughput_vs_oracle"] == pytest.approx(55 / 61)
    assert c["swarm_path_cost_vs_oracle"] == pytest.approx(3.0)
    table = markdown_table(results)
    assert "| s | gwtf | 61 (60–62) |" in table and table.index("| gwtf |") < table.index("| swarm |")
    assert "39.6 %" in comparison_table(results)
    assert runs_csv(results).count("\n") == 10
