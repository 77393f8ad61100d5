"""The one compute thread: every torch call of a node runs here, awaited from the event loop.

Executors are not thread-safe, so a single worker serializes forward, backward, aggregation
steps and state (de)serialization. ``timed`` also returns the seconds the call took on the
thread (not counting the wait in the queue), which feeds the node's compute-time estimate.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _init_thread(torch_threads: int) -> None:
    if torch_threads > 0:
        import torch

        torch.set_num_threads(torch_threads)


class ComputeThread:
    """A single-worker executor for torch work."""

    def __init__(self, torch_threads: int = 1) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gwtf-compute", initializer=_init_thread,
            initargs=(torch_threads,))
        self.busy_s = 0.0

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the compute thread and return its result."""
        result, _ = await self.timed(fn, *args)
        return result

    async def timed(self, fn: Callable[..., T], *args: Any) -> tuple[T, float]:
        """``(fn(*args), seconds it ran)`` on the compute thread."""
        def call() -> tuple[T, float]:
            started = time.perf_counter()
            result = fn(*args)
            return result, time.perf_counter() - started

        result, seconds = await asyncio.get_running_loop().run_in_executor(self._pool, call)
        self.busy_s += seconds
        return result, seconds

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
