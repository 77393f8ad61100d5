"""A graceful leave (first SIGINT/SIGTERM): announce, stop taking flow, finish the current iteration.

The node's record turns ``leaving`` (peers drop it from their flow), its capacity goes to 0 (its units
are pushed back upstream and regrown elsewhere), and its part's members learn the last iteration it
aggregates: the latest it holds work of (queued microbatches of the next iteration included), else
the one before the current. It then waits, at most ``grace_s``, until that iteration's step is done.
A second signal exits at once (``signals``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gwtfp2p.daemon.aggregation.members import MemberTable
from gwtfp2p.daemon.datapath.gate import IterationGate
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.daemon.testing import testpoints

logger = logging.getLogger(__name__)
POLL_S = 0.1


@dataclass(frozen=True)
class Leave:
    """What a leave touches."""

    self_id: str
    progress: NodeProgress
    events: Events
    gate: IterationGate
    members: MemberTable
    set_capacity: Callable[[int], None]  # the flow driver's
    held_until: Callable[[int], int]  # the latest iteration the node holds work of, at least the one given
    refuse_after: Callable[[int], None]  # the data path refuses later iterations (the sender resends them)
    announce: Callable[[], Awaitable[None]]  # tell the part's members
    publish: Callable[[], Awaitable[None]]  # the node's record, now ``leaving``
    grace_s: float


def last_iteration(leave: Leave, active: int | None) -> int:
    """The last iteration this node contributes to (``active``: the one being aggregated, if any)."""
    last = leave.gate.iteration - 1
    if active is not None:
        last = max(last, active)
    return leave.held_until(last)


async def leave(leave: Leave, active: int | None, work: asyncio.Task, abort: asyncio.Event) -> None:
    """Leave gracefully, then stop the node's work (``abort``, cancel)."""
    leave.progress.state = "leaving"
    leave.events.emit("leaving", iteration=leave.gate.iteration)
    leave.set_capacity(0)
    last = last_iteration(leave, active)
    leave.members.set_until(leave.self_id, last)
    leave.refuse_after(last)
    await leave.announce()
    try:
        await leave.publish()
    except Exception as e:  # the DHT may be gone already; leaving goes on
        logger.debug("leaving record not published: %s", e)
    await testpoints.delay("leave", leave.events)  # tests only ($GWTF_DELAY_AT)
    if leave.gate.iteration <= last:
        try:
            await asyncio.wait_for(_until_past(leave.gate, last), leave.grace_s)
        except asyncio.TimeoutError:
            logger.warning("left before finishing iteration %d (grace period of %.0f s over)", last, leave.grace_s)
    abort.set()
    work.cancel()


async def _until_past(gate: IterationGate, iteration: int) -> None:
    while gate.iteration <= iteration:
        await asyncio.sleep(POLL_S)
