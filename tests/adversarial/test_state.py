"""A joiner and a replica serving a noised state under a high claimed iteration (the joiner took the most
advanced replica's state, carried all the routing, and status said in sync): the joiner loads only the
state a majority of its stage's signed records vouch for."""

from __future__ import annotations

import pytest

from tests.adversarial.support import Honest, Mallory, logged

pytestmark = pytest.mark.timeout(300)


def test_a_noised_state_is_not_loaded(honest: Honest, mallory: Mallory) -> None:
    since = honest.iteration()
    servers = honest.stages[2]
    claimed = max(s.of("step")[-1]["iteration"] for s in servers) + 10**6  # far ahead of the swarm
    noised_hash = mallory.do("serve_noised", stage=2, iteration=claimed)
    joiner = honest.swarm.spawn_relay("joiner", "2", "--capacity", "2").wait_ready(180)
    try:
        downloads = [e["source"] for e in joiner.of("downloading")]
        assert downloads[0] == mallory.peer_id, downloads  # the most advanced claim is tried first ...
        assert joiner.ready["state_source"] == "replica" and joiner.ready["state_iteration"] < claimed
        assert logged(joiner, f"no majority of replicas vouches for a state of iteration {claimed}")
        first = joiner.ready["from_iteration"]
        mine = joiner.wait_event("step", 90, iteration=first + 1)
        theirs = servers[0].wait_event("step", 90, iteration=first + 1)
        assert mine["hash"] == theirs["hash"] != noised_hash  # ... the loaded one is the stage's
        honest.assert_healthy(since)
    finally:
        joiner.kill_group()
