"""A graceful leave (first SIGINT/SIGTERM): announce, stop taking flow, finish the current iteration.

The node's record turns ``leaving`` (peers drop it from their flow), its capacity goes to 0 (its
units are pushed back upstream and regrown elsewhere), and its part's members learn the last
iteration it aggregates: the current one if it did work in it, else the previous one. It then
waits, at most ``grace_s``, until that iteration's step is done. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from gwtfp2p.daemon.data_holder import DataHolder
from gwtfp2p.daemon.datapath import RelayDataPath
from gwtfp2p.daemon.records import own_record

if TYPE_CHECKING:
    from gwtfp2p.daemon.node import Node

logger = logging.getLogger(__name__)


def last_iteration(node: Node) -> int:
    """The last iteration this node contributes to: the latest one it holds work of (queued
    microbatches of the next iteration included), else the one before the current."""
    t = node.gate.iteration
    last = t - 1
    if node.aggregator is not None and node.aggregator.active is not None:
        last = max(last, node.aggregator.active)
    if isinstance(node.data, DataHolder) and node.data.ledger is not None:
        last = max(last, node.data.ledger.iteration if node.data.ledger.iteration >= t else last)
    elif isinstance(node.data, RelayDataPath):
        last = max([last, *(r.meta.microbatch.iteration for r in node.data.hops.values())])
    return last


async def _until_past(node: Node, iteration: int) -> None:
    while node.gate.iteration <= iteration:
        await asyncio.sleep(0.1)


async def leave(node: Node, work: asyncio.Task, abort: asyncio.Event) -> None:
    """Leave gracefully, then stop the node's work (``abort``, cancel)."""
    assert node.view is not None and node.routing is not None and node.members is not None
    assert node.peers is not None
    node.state = "leaving"
    node.events.emit("leaving", iteration=node.gate.iteration)
    node.routing.set_capacity(0)
    last = last_iteration(node)
    node.members.set_until(node.peer_id, last)
    if isinstance(node.data, RelayDataPath):
        node.data.accept_until = last  # later forwards are refused: the sender resends them elsewhere
    await node.peers.announce_to_stage()
    try:
        await node.view.publish(own_record(node))
    except Exception as e:  # the DHT may be gone already; leaving goes on
        logger.debug("leaving record not published: %s", e)
    if node.gate.iteration <= last:
        try:
            await asyncio.wait_for(_until_past(node, last), node.config.grace_s)
        except asyncio.TimeoutError:
            logger.warning("left before finishing iteration %d (grace period of %.0f s over)", last,
                           node.config.grace_s)
    abort.set()
    work.cancel()
