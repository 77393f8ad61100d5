"""Discrete-event engine: one heap of timed callbacks in simulated seconds.

Events at the same time run in the order they were scheduled (a sequence number breaks ties), so
a run is deterministic. Cancellation is left to the callbacks (they check the state they act on).
Owns simulated time only; it knows nothing about nodes or messages.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class Engine:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._seq = 0
        self.events_run = 0
        self.stopped = False

    def at(self, time_s: float, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` at ``time_s`` (never earlier than now)."""
        self._seq += 1
        heapq.heappush(self._heap, (time_s if time_s > self.now else self.now, self._seq, fn, args))

    def after(self, delay_s: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + delay_s, fn, *args)

    def stop(self) -> None:
        self.stopped = True

    def run(self, until_s: float) -> None:
        """Run events up to ``until_s`` or until ``stop()``; time ends at the last event run."""
        heap = self._heap
        pop = heapq.heappop
        count = 0
        while heap and not self.stopped:
            if heap[0][0] > until_s:
                self.now = until_s
                break
            time_s, _, fn, args = pop(heap)
            self.now = time_s
            fn(*args)
            count += 1
        self.events_run += count

    @property
    def pending(self) -> int:
        return len(self._heap)
