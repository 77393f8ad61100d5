"""Local swarms for integration tests: ``gwtfp2p.localswarm.processes`` with the tests' defaults (fast ticks,
short heartbeats, INFO logs in each daemon's stderr file, the repository as working directory), their
daemons forked from one preloaded parent for the whole session (``SESSION_ZYGOTES``, started and closed by
the conftest): each test would otherwise import torch, hivemind and transformers once more. Every wait
on their events is scaled by ``$GWTF_TEST_DEADLINE_FACTOR`` (tests/deadlines.py)."""

from __future__ import annotations

import json
from pathlib import Path

from gwtfp2p.localswarm import processes as local_swarm
from gwtfp2p.localswarm.processes import Daemon, Event
from tests.deadlines import DEADLINE_FACTOR

REPO_ROOT = Path(__file__).resolve().parents[2]
FAST = (*local_swarm.FAST, "--log-level", "INFO")

__all__ = ["FAST", "REPO_ROOT", "Daemon", "Event", "Swarm"]


SESSION_ZYGOTES = local_swarm.Zygotes()


LAST_EVENTS = 8  # per daemon, printed when a swarm closes (pytest shows them for a failed test)


class Swarm(local_swarm.Swarm):
    def __init__(self, log_dir: Path, common: tuple[str, ...] = FAST) -> None:
        super().__init__(log_dir, common, cwd=REPO_ROOT, zygotes=SESSION_ZYGOTES, deadline_factor=DEADLINE_FACTOR)

    def close(self, grace_s: float = 10.0) -> None:
        """Stop the daemons; print each one's last events first (progress reports left out): a swarm that
        never trained says why there (a data holder's ``waiting`` reason is in its events, not in its log)."""
        for daemon in self.daemons:
            waiting = daemon.of("waiting")[-1:]
            latest = [e for e in daemon.events if e.get("event") != "progress"][-LAST_EVENTS:]  # progress: every 2 s
            print(f"{daemon.name} last waiting: {json.dumps(waiting, default=str)[:1000]}; last events but "
                  f"progress: {json.dumps(latest, default=str)[:3000]}")
        super().close(grace_s)
