"""``bench_sim.py --resume`` (``benchmarks/sim_runs.py``): a saved run the simulator still reproduces lets the
missing jobs run beside it; a saved summary that no longer matches (one figure changed) stops the resume and
names the field; the jobs left are exactly those no saved run answers. One cheap seeded scenario."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gwtfp2p.sim.batch import jobs_for
from gwtfp2p.sim.scenarios import get_scenario

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from sim_runs import check_reproduces, from_raw, pending, timed, to_raw

SCENARIO = "home-het-c16-llama500m"


def test_a_reproduced_run_resumes_and_a_changed_one_is_refused() -> None:
    jobs = jobs_for(get_scenario(SCENARIO), ("swarm",), 3)
    saved = from_raw(to_raw([timed(jobs[0])], {}, plotted=()))  # through the file format, as a resume reads it
    assert "reproduced" in check_reproduces(saved, jobs, timed, count=1)[0]
    assert [(j.router, j.seed) for j in pending(jobs, saved)] == [("swarm", 1), ("swarm", 2)]
    result, cpu_s, wall_s = saved[0]
    changed = replace(result, summary=replace(result.summary, events=result.summary.events + 1))
    with pytest.raises(SystemExit, match="events"):
        check_reproduces([(changed, cpu_s, wall_s)], jobs, timed, count=1)
    with pytest.raises(SystemExit, match="no saved run"):
        check_reproduces(saved, jobs_for(get_scenario(SCENARIO), ("gwtf",), 1), timed)
