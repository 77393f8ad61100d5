"""A volunteer keeps its peer id across restarts without ``--identity`` (issue 13): the key lives in the
user's data directory (``$XDG_DATA_HOME/gwtf/identity.key``, 0600); a second node started on the same
machine meanwhile gets a temporary id instead of failing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.integration.swarm import Swarm

pytestmark = pytest.mark.timeout(240)


def test_a_restarted_node_keeps_its_peer_id_and_a_second_one_gets_its_own(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "data")}
    key = tmp_path / "data" / "gwtf" / "identity.key"
    swarm = Swarm(tmp_path)
    try:
        first = swarm.spawn("first", "--role", "data", env=env).wait_ready()
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
        second = swarm.spawn("second", "--role", "data", env=env).wait_ready()
        assert second.peer_id != first.peer_id  # the key is held: a temporary one, with a warning
        assert "another gwtf node on this machine uses" in second.stderr_path.read_text()
        for node in (first, second):
            node.terminate()
            assert node.popen.wait(timeout=60) == 0, node.stderr_tail()
        again = swarm.spawn("again", "--role", "data", env=env).wait_ready()
        assert again.peer_id == first.peer_id
    finally:
        swarm.close()
