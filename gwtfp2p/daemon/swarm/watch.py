"""What a node watches and reports besides its own work.

* Stages of the run that had a replica and now have none (their records expired or left): a plain
  ``waiting`` event naming the stage and what to start, repeated while it lasts (the swarm waits and
  says so). ``gwtf status`` says the same from the DHT (``status.py``).
* A relay's first useful microbatch (its first finished backward: its work now counts in the stage's
  gradient): a ``first_microbatch`` event with the seconds since the process started and since it was
  ready (the join-to-useful figure of docs/churn.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.dht import NodeRecord


def dead_stage_reason(stage: int) -> str:
    return (f"stage {stage} has no live replica; start a relay with --stage {stage} "
            f"(or one holding a checkpoint of it: --checkpoint-dir)")


def served_stages(records: Iterable[NodeRecord], n_stages: int) -> set[int]:
    """Relay stages with at least one live (not leaving) record."""
    return {r.stage for r in records if r.role == "relay" and r.state != "leaving" and 1 <= r.stage <= n_stages}


class SwarmWatch:
    """Reports stages that lost their last replica."""

    def __init__(self, stage: int, n_stages: int, *, view: SwarmView, progress: NodeProgress, events: Events,
                 iteration: Callable[[], int], timings: Timings) -> None:
        self.stage = stage
        self.n_stages = n_stages
        self.view = view
        self.progress = progress
        self.events = events
        self.iteration = iteration
        self.timings = timings
        self.seen: set[int] = set()  # stages that had a live replica at some point
        self.dead: list[int] = []
        self._reported_at = 0.0
        self._reported: list[int] = []

    def check(self) -> list[int]:
        """Stages that had a replica and have none now (ours counts as served)."""
        served = served_stages(self.view.records.values(), self.n_stages)
        if self.stage >= 1 and self.progress.state != "leaving":
            served.add(self.stage)
        self.seen |= served
        self.dead = sorted(self.seen - served)
        return self.dead

    async def run(self, stop: asyncio.Event) -> None:
        period = self.timings.heartbeat_s / 2
        while not stop.is_set():
            dead = self.check()
            now = time.monotonic()
            if dead and (dead != self._reported or now - self._reported_at >= self.timings.report_every_s):
                self._reported, self._reported_at = dead, now
                reason = "; ".join(dead_stage_reason(k) for k in dead)
                self.events.emit("waiting", reason=reason, iteration=self.iteration(), dead_stages=dead)
            elif not dead:
                self._reported = []
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), period)


async def first_useful(stop: asyncio.Event, backwards: Callable[[], int], iteration: Callable[[], int],
                       progress: NodeProgress, events: Events, poll_s: float) -> None:
    """Emit ``first_microbatch`` once this relay finished its first backward."""
    while not stop.is_set() and backwards() == 0:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_s)
    if not stop.is_set():
        now = time.time()
        events.emit("first_microbatch", iteration=iteration(), since_start_s=now - progress.started_at,
                    since_ready_s=now - progress.ready_at)
