"""Local swarms for integration tests: ``gwtf_cli.local_swarm`` with the tests' defaults (fast ticks,
short heartbeats, INFO logs in each daemon's stderr file, the repository as working directory)."""

from __future__ import annotations

from pathlib import Path

from gwtf_cli import local_swarm
from gwtf_cli.local_swarm import Daemon, Event

REPO_ROOT = Path(__file__).resolve().parents[2]
FAST = (*local_swarm.FAST, "--log-level", "INFO")

__all__ = ["FAST", "REPO_ROOT", "Daemon", "Event", "Swarm"]


class Swarm(local_swarm.Swarm):
    def __init__(self, log_dir: Path, common: tuple[str, ...] = FAST) -> None:
        super().__init__(log_dir, common, cwd=REPO_ROOT)
