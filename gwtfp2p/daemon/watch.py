"""What a node watches and reports besides its own work.

* Stages of the run that had a replica and now have none (their records expired or left): a plain
  ``waiting`` event naming the stage and what to start, repeated while it lasts (DESIGN §3: the
  swarm waits and says so). ``gwtf status`` says the same from the DHT (``status.py``).
* A relay's first useful microbatch (its first finished backward: its work now counts in the
  stage's gradient): a ``first_microbatch`` event with the seconds since the process started and
  since it was ready (the join-to-useful figure of docs/churn.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gwtfp2p.dht import NodeRecord

if TYPE_CHECKING:
    from gwtfp2p.daemon.node import Node

REPORT_EVERY_S = 5.0
FIRST_USEFUL_POLL_S = 0.05


def dead_stage_reason(stage: int) -> str:
    return (f"stage {stage} has no live replica; start a relay with --stage {stage} "
            f"(or one holding a checkpoint of it: --checkpoint-dir)")


def served_stages(records: Iterable[NodeRecord], n_stages: int) -> set[int]:
    """Relay stages with at least one live (not leaving) record."""
    return {r.stage for r in records if r.role == "relay" and r.state != "leaving" and 1 <= r.stage <= n_stages}


class SwarmWatch:
    """Reports stages that lost their last replica, and a relay's first useful microbatch."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.seen: set[int] = set()  # stages that had a live replica at some point
        self.dead: list[int] = []
        self._reported_at = 0.0
        self._reported: list[int] = []

    def check(self) -> list[int]:
        """Stages that had a replica and have none now (ours counts as served)."""
        node = self.node
        assert node.spec is not None and node.view is not None
        served = served_stages(node.view.records.values(), node.spec.n_stages)
        if node.stage >= 1 and node.state != "leaving":
            served.add(node.stage)
        self.seen |= served
        self.dead = sorted(self.seen - served)
        return self.dead

    async def run(self, stop: asyncio.Event) -> None:
        period = self.node.config.heartbeat_s / 2
        while not stop.is_set():
            dead = self.check()
            now = time.monotonic()
            if dead and (dead != self._reported or now - self._reported_at >= REPORT_EVERY_S):
                self._reported, self._reported_at = dead, now
                reason = "; ".join(dead_stage_reason(k) for k in dead)
                self.node.events.emit("waiting", reason=reason, iteration=self.node.gate.iteration, dead_stages=dead)
            elif not dead:
                self._reported = []
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), period)

    async def first_useful(self, stop: asyncio.Event, ready_at: float) -> None:
        """Emit ``first_microbatch`` once this relay finished its first backward."""
        node = self.node
        while not stop.is_set() and getattr(node.data, "backwards", 0) == 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), FIRST_USEFUL_POLL_S)
        if not stop.is_set():
            now = time.time()
            node.events.emit("first_microbatch", iteration=node.gate.iteration, since_start_s=now - node.started_at,
                             since_ready_s=now - ready_at)
