"""Jobs of the simulator: (scenario, router, seed) triples, run one at a time.

Parallelism (a process pool) belongs to the callers in ``cli/`` and ``benchmarks/``: this package
stays free of processes and threads. A job carries the scenario itself, so overrides travel with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gwtfp2p.sim.params import Scenario, check_router
from gwtfp2p.sim.simulation import RunResult, Simulation


@dataclass(frozen=True)
class Job:
    scenario: Scenario
    router: str
    seed: int


def jobs_for(scenario: Scenario, routers: tuple[str, ...], seeds: int, first_seed: int = 0) -> list[Job]:
    for router in routers:
        check_router(router)
    return [Job(scenario, router, seed) for seed in range(first_seed, first_seed + seeds) for router in routers]


def run_job(job: Job, bin_s: float | None = None) -> RunResult:
    return Simulation(job.scenario, job.seed, job.router).run(bin_s)
