"""The node's view of the swarm from the DHT: heartbeat its own record, read everyone else's.

Every ``heartbeat_s`` the node publishes its record (expiring after two periods) and reads the
run's records; peers that appear, change or disappear (expired or ``leaving``) are reported to
a listener. Reading can be requested early (``poke``), e.g. when a message arrives from a peer
not seen yet. The DHT is always awaited with a deadline; a failed round is logged and retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from gwtfp2p.dht import DHTError, NodeRecord, SwarmDHT

logger = logging.getLogger(__name__)


class ViewListener(Protocol):
    def peer_joined(self, record: NodeRecord) -> None: ...

    def peer_updated(self, record: NodeRecord) -> None: ...

    def peer_left(self, peer: str, record: NodeRecord | None) -> None: ...


class SwarmView:
    """Live records of the run's other nodes (``leaving`` ones excluded), kept fresh."""

    def __init__(self, dht: SwarmDHT, run_id: str, heartbeat_s: float) -> None:
        self.dht = dht
        self.run_id = run_id
        self.self_id = dht.peer_id
        self.heartbeat_s = heartbeat_s
        self.records: dict[str, NodeRecord] = {}
        self.listener: ViewListener | None = None
        self._poke = asyncio.Event()
        self.rounds = 0

    async def publish(self, record: NodeRecord) -> None:
        await self.dht.publish_node(record, heartbeat_s=self.heartbeat_s)

    async def refresh(self) -> dict[str, NodeRecord]:
        """Read the run's records and report changes; returns the live records."""
        nodes = await self.dht.read_nodes(self.run_id)
        live = {p: r for p, r in nodes.items() if p != self.self_id and r.state != "leaving"}
        listener = self.listener
        for peer in [p for p in self.records if p not in live]:
            gone = self.records.pop(peer)
            if listener is not None:
                listener.peer_left(peer, nodes.get(peer, gone))
        for peer, record in sorted(live.items()):
            known = self.records.get(peer)
            self.records[peer] = record
            if listener is None:
                continue
            if known is None:
                listener.peer_joined(record)
            elif known != record:
                listener.peer_updated(record)
        self.rounds += 1
        return self.records

    def poke(self) -> None:
        """Read the DHT again soon (before the next heartbeat)."""
        self._poke.set()

    async def run(self, stop: asyncio.Event, record: Callable[[], NodeRecord]) -> None:
        """Heartbeat + read until ``stop``; DHT failures are logged and retried next round."""
        loop = asyncio.get_running_loop()
        last_publish = -1e9
        while not stop.is_set():
            try:
                if loop.time() - last_publish >= self.heartbeat_s * 0.9:
                    await self.publish(record())
                    last_publish = loop.time()
                await self.refresh()
            except DHTError as e:
                logger.warning("DHT round failed: %s", e)
            self._poke.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._first(stop), self.heartbeat_s / 2)

    async def _first(self, stop: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._poke.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    def by_stage(self, stage: int) -> list[NodeRecord]:
        return [r for _, r in sorted(self.records.items()) if r.stage == stage]
