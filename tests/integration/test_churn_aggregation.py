"""A relay SIGKILLed in the middle of its stage's aggregation, after its contribution reached one
replica and before it reached the other: the survivors agree on the same contributions (the union
of what they hold: the one that got it decides at once, the other learns the decision and pulls the
contribution) without waiting out a deadline, step bit-identically, and training goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from gwtf_cli.demo_cmd import in_sync
from tests.integration.swarm import Daemon, Swarm
from tests.integration.test_daemon_parity import write_spec

pytestmark = pytest.mark.timeout(240)
CRASH_ITERATION = 3
RECOVERED_WITHIN_S = 20.0  # the survivors' step after the crash (the old rule waited 60 s)


def steps_by_iteration(daemon: Daemon) -> dict[int, dict]:
    return {e["iteration"]: e for e in daemon.of("step")}


def test_replica_killed_mid_aggregation(tmp_path: Path) -> None:
    from gwtfp2p.config import RunSpec

    spec = RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2, seed=5, microbatch_size=2, seq_len=16,
                   microbatches_per_dh=6)
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"), "--min-nodes", "5")
        victim = swarm.spawn_relay("x", "1", "--capacity", "2",
                                   env={"GWTF_CRASH_AT": f"exit_mid_aggregation:1:{CRASH_ITERATION}"})
        survivors = [swarm.spawn_relay(name, "1", "--capacity", "2") for name in ("a", "b")]
        swarm.spawn_relay("s2", "2", "--capacity", "8")
        for daemon in swarm.daemons[1:]:
            daemon.wait_ready()
        fault = victim.wait_event("fault", 120)
        assert fault["point"] == "exit_mid_aggregation" and fault["iteration"] >= CRASH_ITERATION
        t = fault["iteration"]
        steps = [s.wait_event("step", 60, iteration=t) for s in survivors]
        assert steps[0]["hash"] == steps[1]["hash"], steps
        assert steps[0]["members"] == steps[1]["members"], steps
        assert victim.peer_id in steps[0]["members"]  # it reached a survivor: used by both
        assert sorted(s["agreement"] for s in steps) == ["adopted", "fast"], steps
        assert max(s["time"] for s in steps) - fault["time"] < RECOVERED_WITHIN_S, steps
        assert victim.popen.wait(timeout=30) != 0
        dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= t + 4, 120, "training goes on")
        for s in survivors:
            s.wait_event("step", 60, iteration=t + 4)
        a, b = (steps_by_iteration(s) for s in survivors)
        for i in range(t + 5):
            assert a[i]["hash"] == b[i]["hash"], (i, a[i], b[i])
            if i > t:
                assert victim.peer_id not in a[i]["members"]
        assert in_sync(swarm.daemons)
    finally:
        swarm.close()
