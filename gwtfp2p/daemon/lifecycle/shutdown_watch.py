"""A stop that overruns: a node asked to stop is gone within ``--grace-s`` + ``Timings.shutdown_s``.

Armed by the first stop signal (``ShutdownWatch.arm_on``). At that deadline the event loop logs, at
ERROR, every task still pending with the lines it waits at, so a shutdown that hangs says where; a few
seconds later the hard exit (``faulthandler``: its own C thread, so a blocked loop cannot stop it)
writes every thread's stack to stderr and ends the process with exit code 1. A node that stops in
time disarms both and never hears of them.
"""

from __future__ import annotations

import asyncio
import faulthandler
import linecache
import logging
import sys
from collections.abc import Iterable
from types import FrameType
from typing import Protocol

logger = logging.getLogger(__name__)
BACKSTOP_S = 5.0  # between the report of what is pending and the hard exit
STACK_FRAMES = 12  # per pending task in the report


class HardExit(Protocol):
    def arm(self, after_s: float) -> None: ...

    def cancel(self) -> None: ...


class FaulthandlerExit:
    """Dump every thread's stack to stderr and exit (code 1) after ``after_s``, unless cancelled first."""

    def arm(self, after_s: float) -> None:
        faulthandler.dump_traceback_later(after_s, exit=True, file=sys.stderr)

    def cancel(self) -> None:
        faulthandler.cancel_dump_traceback_later()


def pending_report(tasks: Iterable[asyncio.Task]) -> str:
    """One block per task not done: its name, then the lines it waits at (innermost last)."""
    blocks = []
    for task in sorted((t for t in tasks if not t.done()), key=lambda t: t.get_name()):
        frames = [_frame_line(f) for f in await_chain(task.get_coro())]
        blocks.append("\n".join([f"[{task.get_name()}]", *frames]))
    return "\n".join(blocks) or "(none)"


def await_chain(coro: object) -> list[FrameType]:
    """The frames of ``coro`` and of what it awaits, outermost first (``Task.get_stack`` gives one frame of a
    suspended coroutine: the outermost, which seldom says what it waits for); at most ``STACK_FRAMES``."""
    frames: list[FrameType] = []
    while coro is not None and len(frames) < STACK_FRAMES:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append(frame)
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return frames


def _frame_line(frame: FrameType) -> str:
    """``file:line in function: source`` (a suspended frame may have no line number)."""
    code, lineno = frame.f_code, frame.f_lineno
    source = linecache.getline(code.co_filename, lineno).strip() if lineno is not None else ""
    return f"  {code.co_filename}:{lineno if lineno is not None else '?'} in {code.co_name}: {source}"


class ShutdownWatch:
    """Reports, then ends, a stop that takes longer than ``deadline_s`` (``backstop_s`` more for the end)."""

    def __init__(self, deadline_s: float, *, backstop_s: float = BACKSTOP_S, hard_exit: HardExit | None = None) -> None:
        self.deadline_s = deadline_s
        self.backstop_s = backstop_s
        self._hard_exit = hard_exit or FaulthandlerExit()
        self._timer: asyncio.TimerHandle | None = None
        self.overran = False

    async def arm_on(self, stop: asyncio.Event) -> None:
        """Arm once ``stop`` is set (a task for the node's whole life; cancelling it before arms nothing)."""
        await stop.wait()
        self.arm()

    def arm(self) -> None:
        if self._timer is not None:
            return
        self._timer = asyncio.get_running_loop().call_later(self.deadline_s, self._report)
        self._hard_exit.arm(self.deadline_s + self.backstop_s)

    def disarm(self) -> None:
        """The node stopped: nothing to report, no hard exit."""
        if self._timer is not None:
            self._timer.cancel()
            self._hard_exit.cancel()
            self._timer = None

    def _report(self) -> None:
        self.overran = True
        logger.error("still stopping %.0f s after the stop signal (--grace-s + Timings.shutdown_s); exiting in "
                     "%.0f s. Tasks still pending:\n%s", self.deadline_s, self.backstop_s,
                     pending_report(asyncio.all_tasks()))
