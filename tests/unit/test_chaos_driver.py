"""The chaos driver's bookkeeping of armed crash points (``gwtf_cli.chaos.ChaosDriver``) on stand-in daemons.

No process is started: the victim is an object that records the signals sent to it, the holder one
whose ``iteration`` events are made by hand.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gwtf_cli.chaos import ChaosDriver, Crash

pytestmark = pytest.mark.timeout(30)


class Popen:
    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class StandIn:
    """A daemon reduced to what the driver reads and does: events, a process and signals."""

    def __init__(self, name: str, events: list[dict[str, Any]] | None = None) -> None:
        self.name = name
        self.events = events or []
        self.popen = Popen()
        self.signals: list[int] = []

    def of(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == name]

    def signal_group(self, sig: int, group: bool = True) -> None:
        self.signals.append(sig)


def driver_with_armed(done_iterations: int, deadline_in_s: float, tmp_path: Path) -> tuple[ChaosDriver, StandIn]:
    holder = StandIn("dh0", [{"event": "iteration", "time": 100.0 + t} for t in range(done_iterations)])
    victim = StandIn("r10")
    driver = ChaosDriver(holder, lambda: [victim], lambda name: StandIn(name), rate=0.34, seed=0, crash_dir=tmp_path,
                         iterations=30)
    crash = Crash(0, "forward", planned_iteration=done_iterations, planned_at=time.time(), victim="r10")
    driver.crashes.append(crash)
    driver.armed["r10"] = (crash, victim, time.time() + deadline_in_s)
    return driver, victim


def test_an_armed_point_not_reached_waits_for_its_deadline(tmp_path: Path) -> None:
    driver, victim = driver_with_armed(done_iterations=10, deadline_in_s=60.0, tmp_path=tmp_path)
    driver._settle_armed()
    assert "r10" in driver.armed and victim.signals == []


def test_an_armed_point_not_reached_by_the_last_iteration_is_killed_in_it(tmp_path: Path) -> None:
    """The point may never be reached before training ends (the victim carries no flow): the crash
    happens at the start of the last iteration instead of after training."""
    driver, victim = driver_with_armed(done_iterations=29, deadline_in_s=60.0, tmp_path=tmp_path)
    driver._settle_armed()
    crash = driver.crashes[0]
    assert "r10" not in driver.armed and victim.signals
    assert crash.how == "killed (point not reached)" and crash.iteration == 29


def test_a_reached_point_is_recorded_at_the_victims_fault(tmp_path: Path) -> None:
    driver, victim = driver_with_armed(done_iterations=29, deadline_in_s=60.0, tmp_path=tmp_path)
    victim.events.append({"event": "fault", "time": 128.5})
    driver._settle_armed()
    crash = driver.crashes[0]
    assert victim.signals == [] and crash.how == "crash point" and crash.iteration == 29
