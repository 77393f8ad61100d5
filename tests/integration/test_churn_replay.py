"""A newcomer whose downloaded state falls behind (its stage steps while it loads: held here with
``$GWTF_DELAY_AT=lag_join:2`` until the stage is two steps past it) replays the steps it missed,
the replicas' logged mean gradients, instead of downloading the whole state again; every replayed
step reproduces the replica's state hash, and from its first step on it is bit-identical to the
other replica."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.churn_support import tiny_spec, write_spec
from tests.integration.swarm import Swarm

pytestmark = pytest.mark.timeout(300)


def test_newcomer_replays_the_steps_it_missed(tmp_path: Path) -> None:
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(tiny_spec(), tmp_path / "spec.json"),
                                     "--min-nodes", "3")
        swarm.spawn_relay("r1", "1")
        server = swarm.spawn_relay("r2", "2")
        for daemon in swarm.daemons[1:]:
            daemon.wait_ready()
        dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= 2, 90, "training")

        newcomer = swarm.spawn_relay("n2", "2", env={"GWTF_DELAY_AT": "lag_join:2"}).wait_ready(120)
        ready = newcomer.ready
        replayed = newcomer.of("replayed")
        downloads = newcomer.of("downloading")
        assert ready["state_source"] == "replica", (ready, downloads, replayed)
        assert len(downloads) == 1, (downloads, replayed)
        assert replayed and ready["replayed_steps"] == sum(e["steps"] for e in replayed) >= 2, replayed
        assert ready["from_iteration"] == ready["state_iteration"] + ready["replayed_steps"]
        first = ready["from_iteration"]
        mine = newcomer.wait_event("step", 60, iteration=first + 2)
        theirs = server.wait_event("step", 60, iteration=first + 2)
        assert mine["hash"] == theirs["hash"]
        steps = {e["iteration"]: e["hash"] for e in server.of("step")}
        assert all(e["hash"] == steps[e["iteration"]] for e in newcomer.of("step"))
    finally:
        swarm.close()
