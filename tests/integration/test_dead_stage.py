"""A stage that loses its only replica. The data holder and the other relay say so plainly (a
``waiting`` event naming the stage and what to start), ``gwtf status --json`` lists it under
``unserved_stages``, and a relay started with the dead relay's ``--checkpoint-dir`` restores that
checkpoint (same state hash as written), catches up with the swarm and training goes on, its steps
in sync with the state it restored."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.integration.churn_support import tiny_spec, write_spec
from tests.integration.swarm import Swarm
from tests.integration.test_daemon_placement import gwtf_status

pytestmark = pytest.mark.timeout(300)


def test_dead_stage_reported_then_restored_from_checkpoint(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpt"
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(tiny_spec(), tmp_path / "spec.json"),
                                     "--min-nodes", "3")
        only = swarm.spawn_relay("r1", "1", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "1")
        other = swarm.spawn_relay("r2", "2")
        only.wait_ready()
        other.wait_ready()
        saved = only.wait_for(lambda e: e.get("event") == "checkpoint" and e["iteration"] >= 3, 120, "checkpoints")
        os.killpg(only.popen.pid, signal.SIGKILL)
        assert only.popen.wait(timeout=15) < 0
        saved = max(only.of("checkpoint"), key=lambda e: e["iteration"])  # the last one it wrote

        for daemon in (dh, other):
            waiting = daemon.wait_for(lambda e: e.get("event") == "waiting" and e.get("dead_stages") == [1], 90,
                                      "the dead stage reported")
            assert "stage 1 has no live replica" in waiting["reason"] and "--stage 1" in waiting["reason"]
        summary = json.loads(gwtf_status(dh.maddr, "--json"))
        assert summary["unserved_stages"] == [1], summary["unserved_stages"]
        stalled_at = max((e["iteration"] for e in dh.of("iteration")), default=0)

        restored = swarm.start_relay("r3", "1", "--checkpoint-dir", str(checkpoints))
        ready = restored.ready
        assert ready["state_source"] == "checkpoint", ready
        assert ready["state_bytes"] > 0 and ready["state_iteration"] == saved["iteration"], (ready, saved)
        first = restored.wait_event("step", 120)
        assert first["iteration"] >= saved["iteration"]
        dh.wait_for(lambda e: e.get("event") == "iteration" and e["iteration"] >= stalled_at + 3, 120,
                    "training after the restore")
        assert gwtf_status_unserved(dh.maddr) == []
        losses = [e["loss"] for e in dh.of("iteration") if e.get("loss") is not None]
        assert all(loss == loss and loss > 0 for loss in losses)  # finite, recorded
    finally:
        swarm.close()


def gwtf_status_unserved(maddr: str) -> list[int]:
    return json.loads(gwtf_status(maddr, "--json"))["unserved_stages"]
