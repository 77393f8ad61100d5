"""Relay crash mid-backward: a stage-1 relay is SIGKILLed when the first gradient of an iteration
reaches it (``exit_before_backward``), after it sent its forwards on. The stage-2 relay, whose
gradient cannot be delivered, tells the data holder (``Lost``); the data holder resends its kept
outputs to the other stage-1 replica with a hint to rejoin the stage-2 relay, which recomputes one
hop; the stage-2 relay recognizes the duplicate id and sends its cached gradient instead of
recomputing. One hop recomputed per affected microbatch, each counted once per part, replicas in
sync, every loss equal to ``PipelineHarness``'s.
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


def test_relay_crash_mid_backward(tmp_path: Path) -> None:
    spec = tiny_spec()
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"),
                                     "--max-iterations", str(ITERATIONS), "--min-nodes", "4")
        victim = spawn_crashing(swarm, "r1a", f"exit_before_backward:1:{CRASH_FROM}", "--stage", "1",
                                *swarm.bootstrap_args(), "--capacity", "2")
        r1b = swarm.spawn_relay("r1b", "1", "--capacity", "2")
        r2 = swarm.spawn_relay("r2", "2")
        for daemon in (victim, r1b, r2):
            daemon.wait_ready()
        fault = victim.wait_event("fault", 150)
        assert victim.popen.wait(timeout=15) < 0
        dh.wait_event("training_done", 150)

        assert_no_loss(dh, ITERATIONS)
        resent = [e for e in dh.of("recovery") if e["kind"] in ("forward_resend", "backward_resend")]
        assert resent and {e["lost"] for e in resent} == {victim.peer_id}
        assert {e["kind"] for e in resent} == {"backward_resend"}  # the stage-2 relay held every one
        assert [e["recomputed_hops"] for e in resent] == [1] * len(resent)
        assert r1b.of("recovery") == []  # the new replica recomputes; nothing to recover there
        rejoined = {e["microbatch"] for e in r2.of("recovery") if e["kind"] in ("gradient_resend", "repoint")}
        assert rejoined == {e["microbatch"] for e in resent}
        assert_in_sync_and_counted(swarm, [dh], {t: MICROBATCHES for t in range(ITERATIONS)})
        assert_parity(spec, [dh], 1)
        report("relay crash mid-backward", swarm, fault["iteration"], [dh])
    finally:
        swarm.close()
