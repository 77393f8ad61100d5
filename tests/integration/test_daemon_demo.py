"""``gwtf demo --json``: a whole local swarm ends with one JSON object (iterations, one loss per
iteration, replicas in sync, tokens/s) and leaves no process behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.deadlines import scaled
from tests.integration.swarm import REPO_ROOT

pytestmark = pytest.mark.timeout(240)


def test_demo_json_summary() -> None:
    result = subprocess.run([sys.executable, "-m", "gwtf_cli.main", "demo", "--json", "--iterations", "6",
                             "--relays-per-stage", "1"], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=scaled(220), start_new_session=True)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["iterations"] == 6 and len(summary["losses"]) == 6
    assert summary["replicas_in_sync"] is True and summary["tokens_per_s"] > 0
    assert summary["losses"][-1] < summary["losses"][0]
    assert sorted(n["stage"] for n in summary["nodes"]) == [0, 1, 2]
    assert summary["status"]["unserved_stages"] == []
