"""``--stage auto`` on a real swarm: joiners fill the stages so every stage is served, then the
bottleneck; a newcomer that raises the flow gets flow within a few ticks (and joins by
downloading its stage's state); ``gwtf status`` and ``--json`` show every node, stage and route."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gwtf_cli.demo_cmd import in_sync
from tests.deadlines import scaled
from tests.integration.swarm import REPO_ROOT, Swarm
from tests.integration.test_daemon_parity import write_spec

pytestmark = pytest.mark.timeout(240)
TICK_S = 0.25


def start_status(maddr: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gwtf_cli.main", "status", "--initial-peers", maddr, *args],
                            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish_status(process: subprocess.Popen) -> str:
    out, err = process.communicate(timeout=scaled(120))
    assert process.returncode == 0, err
    return out


def gwtf_status(maddr: str, *args: str) -> str:
    return finish_status(start_status(maddr, *args))


def test_auto_placement_newcomer_and_status(tmp_path: Path) -> None:
    from gwtfp2p.config import RunSpec

    spec = RunSpec(model_family="gpt2", model_preset="tiny", n_stages=2, seed=3, microbatch_size=2, seq_len=16,
                   microbatches_per_dh=6)
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--run-spec", write_spec(spec, tmp_path / "spec.json"))
        stages = [swarm.start_relay(f"r{i}", "auto", "--capacity", "4").ready["stage"] for i in range(3)]
        assert stages[:2] == [1, 2]  # every stage served first (the third: no stage raises the flow)
        dh.wait_for(lambda e: e.get("event") == "iteration" and e["units"] == 4, 60, "4 units routed")
        newcomer = swarm.start_relay("r3", "auto", "--capacity", "4")
        assert newcomer.ready["stage"] == 3 - stages[2], newcomer.ready  # the bottleneck: 4 of 6 units
        assert "limits the flow" in newcomer.ready["stage_reason"]
        online_at = time.time()
        got = newcomer.wait_for(lambda e: e.get("event") == "progress" and e.get("forwards", 0) > 0, 60,
                                "the newcomer's first microbatch")
        ticks = (got["time"] - online_at) / TICK_S
        assert ticks < 40, f"newcomer waited {ticks:.0f} ticks for flow"
        last = dh.wait_for(lambda e: e.get("event") == "iteration" and e["units"] == 6, 60, "6 units routed")
        newcomer.wait_event("step", 60, iteration=last["iteration"])
        assert in_sync(swarm.daemons)  # replicas that joined mid-run (state download) step in sync
        as_json, as_table = start_status(dh.maddr, "--json"), start_status(dh.maddr)
        summary = json.loads(finish_status(as_json))
        nodes = {n["peer_id"]: n for n in summary["nodes"]}
        assert {d.peer_id for d in swarm.daemons} <= set(nodes)
        for daemon in swarm.daemons:
            assert nodes[daemon.peer_id]["stage"] == daemon.ready["stage"]
        assert summary["unserved_stages"] == [] and summary["routing"]
        assert {r["from"] for r in summary["routing"]} >= {dh.peer_id}
        assert summary["flow"]["units"] == summary["flow"]["oracle_units"] == 6
        table = finish_status(as_table)
        for daemon in swarm.daemons:
            assert daemon.peer_id[-6:] in table
        assert "routing" in table
    finally:
        swarm.close()
