"""``gwtf join --heartbeat-file``: a real node writes the file the Docker HEALTHCHECK reads.

Ready: the file appears with the node's peer id and the health check passes; while it runs, the
file follows its periodic events; on SIGTERM it leaves, exits 0 and the file's last event is
``stopped``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.swarm import Swarm

pytestmark = pytest.mark.timeout(120)


def health_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gwtf_cli.heartbeat", str(path), "--max-age-s", "30"],
                          capture_output=True, text=True, timeout=30)


def test_a_ready_node_keeps_its_heartbeat_fresh_and_leaves_a_stopped_one(tmp_path: Path) -> None:
    path = tmp_path / "run" / "heartbeat.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"time": 0.0, "event": "progress", "peer_id": "left over"}))
    swarm = Swarm(tmp_path)
    try:
        dh = swarm.start_data_holder("dh0", "--heartbeat-file", str(path))
        record = json.loads(path.read_text())
        assert record["peer_id"] == dh.peer_id and record["maddrs"] == dh.ready["maddrs"]
        assert health_check(path).returncode == 0
        progress = dh.wait_event("progress", 30)  # every --heartbeat-s (2 s in the tests)
        later = dh.wait_for(lambda e: e.get("event") == "progress" and e["time"] >= progress["time"] + 1.0, 30,
                            "a second progress event")
        assert json.loads(path.read_text())["time"] >= later["time"] - 1.0
        dh.terminate()
        assert dh.popen.wait(timeout=60) == 0, dh.stderr_tail()
        assert json.loads(path.read_text())["event"] == "stopped"
    finally:
        swarm.close()
