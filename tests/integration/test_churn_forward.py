"""Relay crash mid-forward: a stage-1 relay is SIGKILLed (with its DHT process and p2pd) right after
computing a forward it acknowledged, before sending it on (``exit_after_forward``). The data holder
finds the relay dead and resends its kept outputs to the other stage-1 replica (forward failure:
nobody downstream held them); no microbatch is lost, each is counted once per part, the replicas
stay in sync and every loss matches ``PipelineHarness`` on the same batches.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.churn_support import (
    MICROBATCHES,
    assert_in_sync_and_counted,
    assert_no_loss,
    assert_parity,
    report,
    spawn_crashing,
    tiny_spec,
    write_spec,
)
from tests.integration.swarm import Swarm

pytestmark = pytest.mark.timeout(240)
ITERATIONS = 7
CRASH_FROM = 3


def test_relay_crash_mid_forward(tmp_path: Path) -> None:
    spec = tiny_spec()
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"),
                                     "--max-iterations", str(ITERATIONS), "--min-nodes", "4")
        victim = spawn_crashing(swarm, "r1a", f"exit_after_forward:1:{CRASH_FROM}", "--stage", "1",
                                *swarm.bootstrap_args(), "--capacity", "2")
        others = [swarm.spawn_relay("r1b", "1", "--capacity", "2"), swarm.spawn_relay("r2", "2")]
        for daemon in (victim, *others):
            daemon.wait_ready()
        fault = victim.wait_event("fault", 150)
        assert victim.popen.wait(timeout=15) < 0  # killed by the signal, not exited
        dh.wait_event("training_done", 150)

        assert_no_loss(dh, ITERATIONS)
        resent = [e for e in dh.of("recovery") if e["kind"] in ("forward_resend", "backward_resend")]
        assert resent and {e["lost"] for e in resent} == {victim.peer_id}
        assert {e["kind"] for e in resent} == {"forward_resend"}  # nothing downstream held them
        assert all(e["recomputed_hops"] <= 1 for e in resent)
        assert_in_sync_and_counted(swarm, [dh], {t: MICROBATCHES for t in range(ITERATIONS)})
        assert_parity(spec, [dh], 1)
        report("relay crash mid-forward", swarm, fault["iteration"], [dh])
    finally:
        swarm.close()
