"""A stage-1 relay SIGKILLed (with its DHT process and p2pd) at a named point of the data plane, in
a swarm of a data holder, two stage-1 replicas and one stage-2 relay:

* mid-forward (``exit_after_forward``): right after computing a forward it acknowledged, before
  sending it on. The data holder finds the relay dead and resends its kept outputs to the other
  stage-1 replica (forward failure: nobody downstream held them).
* mid-backward (``exit_before_backward``): when the first gradient of an iteration reaches it,
  after it sent its forwards on. The stage-2 relay, whose gradient cannot be delivered, tells the
  data holder (``Lost``); the data holder resends its kept outputs to the other stage-1 replica
  with a hint to rejoin the stage-2 relay, which recomputes one hop; the stage-2 relay recognizes
  the duplicate id and sends its cached gradient instead of recomputing.

Either way no microbatch is lost, at most one hop is recomputed per affected microbatch, each is
counted once per part, the replicas stay in sync and every loss matches ``PipelineHarness``.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

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
from tests.integration.swarm import Daemon, Event, Swarm

pytestmark = pytest.mark.timeout(240)
ITERATIONS = 7
CRASH_FROM = 3


class Crashed(NamedTuple):
    dh: Daemon
    victim: Daemon
    r1b: Daemon
    r2: Daemon
    resent: list[Event]  # the data holder's forward/backward resends


def crash_relay(swarm: Swarm, tmp_path: Path, point: str, what: str) -> Crashed:
    """Train ITERATIONS with the stage-1 relay r1a crashing at ``point``; the common checks."""
    spec = tiny_spec()
    dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"),
                                 "--max-iterations", str(ITERATIONS), "--min-nodes", "4")
    # One at a time, the victim first: the flow routes both units through it as soon as stage 2 is there, and
    # r1b, the last to come, takes none without a real gain. (Started together, r1b was once ready before the
    # victim, carried both units, and the victim never forwarded anything to crash on.)
    victim = spawn_crashing(swarm, "r1a", f"{point}:1:{CRASH_FROM}", "--stage", "1", *swarm.bootstrap_args(),
                            "--capacity", "2").wait_ready()
    r2 = swarm.spawn_relay("r2", "2").wait_ready()
    r1b = swarm.spawn_relay("r1b", "1", "--capacity", "2").wait_ready()
    fault = victim.wait_event("fault", 150)
    assert victim.popen.wait(timeout=15) < 0  # killed by the signal, not exited
    dh.wait_event("training_done", 150)

    assert_no_loss(dh, ITERATIONS)
    resent = [e for e in dh.of("recovery") if e["kind"] in ("forward_resend", "backward_resend")]
    assert resent and {e["lost"] for e in resent} == {victim.peer_id}
    assert all(e["recomputed_hops"] <= 1 for e in resent)
    assert_in_sync_and_counted(swarm, [dh], {t: MICROBATCHES for t in range(ITERATIONS)})
    assert_parity(spec, [dh], 1)
    report(what, swarm, fault["iteration"], [dh])
    return Crashed(dh, victim, r1b, r2, resent)


def test_relay_crash_mid_forward(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path)
    try:
        crashed = crash_relay(swarm, tmp_path, "exit_after_forward", "relay crash mid-forward")
        assert {e["kind"] for e in crashed.resent} == {"forward_resend"}  # nothing downstream held them
    finally:
        swarm.close()


def test_relay_crash_mid_backward(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path)
    try:
        crashed = crash_relay(swarm, tmp_path, "exit_before_backward", "relay crash mid-backward")
        assert {e["kind"] for e in crashed.resent} == {"backward_resend"}  # the stage-2 relay held every one
        assert [e["recomputed_hops"] for e in crashed.resent] == [1] * len(crashed.resent)
        assert crashed.r1b.of("recovery") == []  # the new replica recomputes; nothing to recover there
        rejoined = {e["microbatch"] for e in crashed.r2.of("recovery") if e["kind"] in ("gradient_resend", "repoint")}
        assert rejoined == {e["microbatch"] for e in crashed.resent}
    finally:
        swarm.close()
