"""Data holder crash mid-iteration: one of two data holders is SIGKILLed right after its microbatches
of an iteration were taken by the first relays (``exit_after_sending``). The relays find it dead and
free its microbatches' state (``dh_dropped``, unless the iteration ended first); the other data holder
and the relays go on: it loses
no microbatch, every part counts each of its microbatches once, replicas stay in sync, and its losses
match ``PipelineHarness`` fed with the batches of the data holders that took part in each iteration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.churn_support import (
    MICROBATCHES,
    assert_in_sync_and_counted,
    assert_no_loss,
    assert_parity,
    recoveries,
    report,
    spawn_crashing,
    swarm_losses,
    tiny_spec,
    write_spec,
)
from tests.integration.swarm import Swarm

pytestmark = pytest.mark.timeout(240)
ITERATIONS = 7
CRASH_AT = 3


def test_data_holder_crash_mid_iteration(tmp_path: Path) -> None:
    spec = tiny_spec()
    swarm = Swarm(tmp_path)
    try:
        dh0 = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"), "--shard",
                                      "0/2", "--max-iterations", str(ITERATIONS), "--min-nodes", "4")
        victim = spawn_crashing(swarm, "dh1", f"exit_after_sending:0:{CRASH_AT}", "--role", "data",
                                *swarm.bootstrap_args(), "--shard", "1/2")
        relays = [swarm.spawn_relay("r1", "1"), swarm.spawn_relay("r2", "2")]
        for daemon in (victim, *relays):
            daemon.wait_ready()
        fault = victim.wait_event("fault", 150)
        assert fault["iteration"] == CRASH_AT
        assert victim.popen.wait(timeout=15) < 0
        dh0.wait_event("training_done", 150)

        assert_no_loss(dh0, ITERATIONS)
        _, participants = swarm_losses([dh0, victim])
        assert all(participants[t] == [0, 1] for t in range(CRASH_AT)), participants
        assert all(participants[t] == [0] for t in range(CRASH_AT, ITERATIONS)), participants
        # Relays drop a dead data holder's microbatches when they find it dead (``dh_dropped``, forward state
        # freed), or with the iteration's end if the other data holder closes it first, or not at all if
        # its round trips beat its crash (a loaded machine): whichever, nothing of it stays in flight (below),
        # and nothing of a live data holder is dropped.
        dropped = [e for e in recoveries(swarm) if e["kind"] == "dh_dropped"]
        assert {e["data_holder"] for e in dropped} <= {victim.peer_id}, dropped
        for relay in relays:  # nothing of the dead data holder is left in flight
            relay.wait_for(lambda e: e.get("event") == "progress" and e["iteration"] >= ITERATIONS
                           and e["in_flight"] == 0, 30, "a relay with nothing in flight")
        # Every part counts the microbatches of the data holders the iteration kept (``Closed.data_holders``),
        # so a victim's microbatch whose round trip beat its crash counts nowhere: each part counts dh0's 4 from
        # CRASH_AT on, and the training is one process's throughout (docs/testing.md: the race this was).
        counts = {t: (2 if t < CRASH_AT else 1) * MICROBATCHES for t in range(ITERATIONS)}
        assert_in_sync_and_counted(swarm, [dh0], counts)
        assert_parity(spec, [dh0, victim], 2)
        report("data holder crash mid-iteration", swarm, CRASH_AT, [dh0])
    finally:
        swarm.close()
