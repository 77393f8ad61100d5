"""Joins mid-run. A newcomer SIGKILLed while its state download is in flight (the serving replica
holds the request: ``$GWTF_DELAY_AT=serve_state``) is waited for by nobody: iterations go on at
their pace and the serving replica keeps stepping. A second newcomer downloads the stage's state
(verified), enters aggregation at an iteration boundary, attracts flow (its first useful
microbatch) and has the same state hash as the other replica from its first step on."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from gwtf_cli.demo_cmd import in_sync
from tests.integration.swarm import Swarm
from tests.integration.test_daemon_parity import write_spec
from tests.integration.test_daemon_placement import gwtf_status

pytestmark = pytest.mark.timeout(300)
SERVE_DELAY_S = 8.0
NORMAL_ITERATION_S = 10.0  # an iteration here takes well under a second; a wait for the dead would take 60 s


def wait_record_past_zero(maddr: str, peer_id: str, timeout_s: float = 60.0) -> None:
    """Until ``peer_id``'s DHT record names an iteration past 0 (``gwtf status --json``): a newcomer that
    reads a record of iteration 0 (not yet refreshed: one heartbeat is 5 s) loads the seeded initial
    state and replays the steps, with no download to kill."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        nodes = json.loads(gwtf_status(maddr, "--json"))["nodes"]
        if any(n["peer_id"] == peer_id and n["iteration"] > 0 for n in nodes):
            return
    raise TimeoutError(f"no record of {peer_id} past iteration 0 within {timeout_s:.0f} s")


def test_newcomer_killed_mid_download_then_newcomer_in_sync(tmp_path: Path) -> None:
    from gwtfp2p.config import RunSpec

    spec = RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2, seed=7, microbatch_size=2, seq_len=16,
                   microbatches_per_dh=6)
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"), "--min-nodes", "3")
        swarm.spawn_relay("r1", "1", "--capacity", "8")
        server = swarm.spawn_relay("r2", "2", "--capacity", "4", env={"GWTF_DELAY_AT": f"serve_state:{SERVE_DELAY_S}"})
        for daemon in swarm.daemons[1:]:
            daemon.wait_ready()
        dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= 2, 90, "training")
        wait_record_past_zero(dh.maddr, server.peer_id)  # else the newcomer starts from the seed and replays

        doomed = swarm.spawn_relay("n1", "2", "--capacity", "4")
        doomed.wait_event("downloading", 90)
        doomed_id = doomed.wait_event("placed", 5)["peer_id"]  # it never gets ready: its id from "placed"
        delay = server.wait_event("delay", 30, point="serve_state")
        os.killpg(doomed.popen.pid, signal.SIGKILL)
        killed_at = delay["time"]
        assert doomed.popen.wait(timeout=15) < 0
        later = dh.wait_for(lambda e: e.get("event") == "iteration" and e["time"] > killed_at + SERVE_DELAY_S + 2,
                            120, "iterations after the serve delay")
        after_kill = [e for e in dh.of("iteration") if killed_at <= e["time"] <= later["time"]]
        assert after_kill and max(e["seconds"] for e in after_kill) < NORMAL_ITERATION_S, after_kill
        assert server.wait_event("step", 30, iteration=later["iteration"])
        assert not any(doomed_id in e.get("members", []) for e in server.of("step"))

        newcomer = swarm.start_relay("n2", "2", "--capacity", "4")
        ready = newcomer.ready
        assert ready["state_source"] == "replica" and ready["state_bytes"] > 0 and ready["from_iteration"] > 2
        useful = newcomer.wait_event("first_microbatch", 90)
        first = ready["from_iteration"]
        mine = newcomer.wait_event("step", 60, iteration=first)
        server.wait_event("step", 60, iteration=first)
        steps = {e["iteration"]: e["hash"] for e in server.of("step")}
        assert mine["hash"] == steps[first]
        newcomer.wait_event("step", 60, iteration=first + 3)
        own_steps = list(newcomer.of("step"))  # a snapshot: both replicas keep stepping (≈ 0.3 s per iteration)
        server.wait_event("step", 60, iteration=own_steps[-1]["iteration"])  # its event may come a moment later
        server_steps = {e["iteration"]: e["hash"] for e in server.of("step")}
        for event in own_steps:
            assert event["hash"] == server_steps[event["iteration"]]
        assert in_sync([d for d in swarm.daemons if d is not doomed])
        print("JOIN", json.dumps({"state_bytes": ready["state_bytes"], "download_s": ready["download_s"],
                                  "start_to_ready_s": round(ready["time"] - newcomer.started_at, 2),
                                  "ready_to_first_useful_s": round(useful["since_ready_s"], 2)}))
    finally:
        swarm.close()
