"""Chaos, short: a swarm of 8 daemons (2 data holders, 2 stages × 3 relays, geo10 link emulation)
trains 12 iterations while a seeded driver crashes 4 relays (random SIGKILLs and crash points
mid-forward, mid-backward, mid-aggregation) and starts replacements (``--stage auto``). Same checks
as ``benchmarks/bench_chaos.py``: no microbatch of a live data holder lost (each loss recorded
once), every part's surviving replicas with one state hash after every step, each microbatch
counted at most once per part, the loss going down, the run within its hard time limit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gwtfp2p.localswarm.chaos_run import ChaosSetup, run_chaos

pytestmark = pytest.mark.timeout(300)
SETUP = ChaosSetup(iterations=12, rate=0.34, seed=3, link_scale=1.0, limit_s=240.0,
                   modes=("forward", "backward", "aggregation", "random"))


def test_chaos_short(tmp_path: Path) -> None:
    assert SETUP.processes >= 8
    result = run_chaos(SETUP, tmp_path)
    per_crash = result.pop("per_crash")
    trail = result.pop("trail")
    print("CHAOS", json.dumps({k: v for k, v in result.items() if k != "setup"}, default=str))
    print("\n".join(trail))  # a failed run's story, one event per line (a retry's summary shows its end)
    assert result["violations"] == [], result["violations"]
    assert result["crashes"] >= 4 and result["iterations"] == 12
    assert result["lost_microbatches"] == 0 and result["replicas_in_sync"] and result["loss_down"]
    # one hop redone per microbatch a crash hit (two at most if two crashes took both hops of its path)
    assert result["recomputed_hops"] <= SETUP.stages * result["affected_microbatches"]
    assert all(c["at"] > 0 for c in per_crash), per_crash  # every planned victim died
    assert [c["mode"] for c in per_crash] == list(SETUP.modes)
    assert result["wall_s"] < SETUP.limit_s + 30
