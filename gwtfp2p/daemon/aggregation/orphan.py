"""A stage with no live replica in a running swarm: make sure of it, then restore it from a local checkpoint.

A joiner that finds no online replica of its stage reads the DHT again for a while (``confirm_orphaned``):
under load the replicas' records may have lapsed, and restoring over a live stage would fork it. A stage
still without replicas is restored from this node's checkpoint (``restore_checkpoint``: ``--checkpoint-dir``,
its hash verified on load); ``joining`` decides the iteration it enters at (docs/churn.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gwtfp2p.daemon.aggregation import checkpoint
from gwtfp2p.daemon.compute import ComputeThread
from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.swarm.view import SwarmView
from gwtfp2p.dht import NodeRecord
from gwtfp2p.model.state import StateError
from gwtfp2p.model.trainable import Trainable

logger = logging.getLogger(__name__)


async def confirm_orphaned(view: SwarmView, stage: int, sources: Callable[[], list[NodeRecord]],
                           timings: Timings) -> list[NodeRecord]:
    """No replica of ``stage`` in the view of a running swarm: read the DHT again for at most
    ``orphan_confirm_s``. The replicas that showed up (``sources()``); none: the stage is orphaned."""
    deadline = time.monotonic() + timings.orphan_confirm_s
    while time.monotonic() < deadline:
        await asyncio.sleep(min(timings.heartbeat_s / 2, max(0.0, deadline - time.monotonic())))
        await view.refresh()
        if found := sources():
            logger.info("stage %d: replicas showed up after a second look: %s", stage,
                        ", ".join(r.peer_id for r in found))
            return found
    return []


async def restore_checkpoint(part: Trainable, compute: ComputeThread, checkpoint_dir: str, run_id: str,
                             stage: int) -> checkpoint.Checkpoint | None:
    """This node's checkpoint of (run, stage), loaded into ``part`` with its hash verified; None if there is
    none (or no ``checkpoint_dir``) or it is not usable (logged: the part keeps its initial weights)."""
    if not checkpoint_dir:
        return None
    try:
        saved = checkpoint.read(checkpoint_dir, run_id, stage)
        if saved is not None:
            await compute.run(part.load_state_bytes, saved.data, saved.state_hash)
        return saved
    except (checkpoint.CheckpointError, StateError, ValueError) as e:
        logger.error("checkpoint of stage %d not usable: %s", stage, e)
        return None
