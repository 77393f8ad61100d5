"""Control messages from a peer not entitled to send them: ``Closed(t+3)`` to every relay (relays stepped
early with no microbatch and the data holder stalled for good) and an aggregation ``view`` message."""

from __future__ import annotations

import pytest

from tests.adversarial.support import Honest, Mallory, logged

pytestmark = pytest.mark.timeout(300)


def test_forged_closed_and_view_messages_are_refused(honest: Honest, outsider: Mallory) -> None:
    since = honest.iteration()
    iteration = min(r.of("step")[-1]["iteration"] for r in honest.relays) + 1
    acks = outsider.do("control", relays=[r.peer_id for r in honest.relays], holder=honest.dh.peer_id, stage=1,
                      iteration=iteration)
    assert all(a.startswith("refused") for a in acks.values()), acks
    assert all("does not serve part 1" in acks[r.peer_id] for r in honest.stages[1]), acks
    honest.assert_healthy(since, more=4)
    for relay in honest.relays:  # nobody stepped early: every step took the microbatches of its iteration
        steps = [e for e in relay.of("step") if iteration <= e["iteration"] <= iteration + 3]
        assert steps and all(e["count"] > 0 for e in steps), steps
    assert all(logged(r, f"refused Closed from {outsider.peer_id}") for r in honest.relays)
