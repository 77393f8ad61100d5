"""The chaos driver's bookkeeping of armed crash points (``gwtfp2p.localswarm.chaos.ChaosDriver``) on stand-in daemons.

No process is started: the victim is an object that records the signals sent to it, the holder one
whose ``iteration`` events are made by hand.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from gwtfp2p.localswarm.chaos import ChaosDriver, Crash

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


def test_a_victim_needs_another_replica_of_its_stage_that_has_stepped(tmp_path: Path) -> None:
    """A replacement that is ready but has not stepped may not be a member of the iteration under way: it
    does not make its stage's other replica killable (a seed-5 churn demo lost a stage's whole iteration so)."""
    def relay(name: str, stage: int, stepped: bool) -> StandIn:
        return StandIn(name, [{"event": "ready", "stage": stage}] + ([{"event": "step", "stage": stage}] * stepped))

    old1, fresh1, old2a, old2b = relay("r1", 1, True), relay("j1", 1, False), relay("r2", 2, True), relay("r3", 2, True)
    relays = [old1, fresh1, old2a, old2b]
    driver = ChaosDriver(StandIn("dh0"), lambda: relays, lambda name: StandIn(name), rate=0.34, seed=0,
                         crash_dir=tmp_path, iterations=30)
    assert [d.name for d in driver._eligible()] == ["j1", "r2", "r3"]  # r1 is its stage's only stepped replica
    driver.doomed.add("r2")
    assert [d.name for d in driver._eligible()] == ["j1"]  # r3 is now the last of stage 2
    fresh1.events.append({"event": "step", "stage": 1})
    assert [d.name for d in driver._eligible()] == ["r1", "j1"]
    driver.kill_last = True
    assert len(driver._eligible()) == 3
