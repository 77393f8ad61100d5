"""``localswarm.processes.group_members``: what a reaped daemon's process group still holds (an orphaned
DHT child keeping our stdout pipe open), the only processes a late kill may signal."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gwtfp2p.localswarm.processes import group_members

pytestmark = pytest.mark.timeout(60)


def test_a_group_outlives_its_reaped_leader_until_its_last_member_exits() -> None:
    # The leader starts a grandchild in its group, prints its pid and exits (as a daemon whose DHT hung).
    script = ("import subprocess, sys; p = subprocess.Popen(['sleep', '30']); print(p.pid, flush=True)")
    leader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    orphan = int(leader.stdout.readline())
    leader.wait(timeout=30)
    try:
        assert group_members(leader.pid) == [orphan]
    finally:
        subprocess.run(["kill", "-9", str(orphan)], check=False)
    assert group_members(2**22 + 7) == []
