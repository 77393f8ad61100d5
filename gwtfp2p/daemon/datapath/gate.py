"""The iteration gate of one part: its current iteration, which iterations are closed, and waits.

A part's iteration is the number of aggregation steps it has taken. Work of a later iteration
(a forward of t+1 arriving while this relay still aggregates t) waits in ``reach``; the
aggregation loop waits in ``wait_closed`` until the data holders closed the iteration. Every
wait is bounded by the caller's deadline.
"""

from __future__ import annotations

import asyncio


class IterationGate:
    def __init__(self, iteration: int) -> None:
        self.iteration = iteration
        self.aggregating = False
        self._closed: set[int] = set()
        self._changed = asyncio.Condition()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait_for(self, predicate, timeout_s: float | None) -> bool:
        async def wait() -> None:
            async with self._changed:
                await self._changed.wait_for(predicate)

        try:
            await asyncio.wait_for(wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False

    async def reach(self, iteration: int, timeout_s: float | None = None) -> bool:
        """Wait until this part is at ``iteration`` (False at the deadline or if it went past)."""
        ok = await self._wait_for(lambda: self.iteration >= iteration and not self.aggregating, timeout_s)
        return ok and self.iteration == iteration

    async def close(self, iteration: int) -> None:
        """The data holders closed ``iteration`` (idempotent)."""
        if iteration not in self._closed and iteration >= self.iteration:
            self._closed.add(iteration)
            await self._notify()

    def is_closed(self, iteration: int) -> bool:
        return iteration in self._closed

    async def wait_closed(self, iteration: int, timeout_s: float | None = None) -> bool:
        return await self._wait_for(lambda: iteration in self._closed, timeout_s)

    async def begin_step(self) -> None:
        self.aggregating = True
        await self._notify()

    async def advance(self, iteration: int) -> None:
        """The step of ``iteration - 1`` is done: work of ``iteration`` may run."""
        self.iteration = iteration
        self.aggregating = False
        self._closed = {t for t in self._closed if t >= iteration}
        await self._notify()

    async def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until no aggregation step is running (a consistent state to serve)."""
        return await self._wait_for(lambda: not self.aggregating, timeout_s)
