"""The node's view of the swarm from the DHT: heartbeat its own record, read everyone else's.

Every ``heartbeat_s`` the node publishes its record (expiring after two periods) and reads the
run's records; peers that appear, change or disappear (expired or ``leaving``) are reported to the
listener that ``follow``s the view. Reading can be requested early (``poke``), e.g. when a message
arrives from a peer not seen yet. The DHT is always awaited with a deadline; a failed round is
logged and retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from gwtfp2p.daemon.swarm.admitted import AdmittedPeers
from gwtfp2p.dht import DHTError, NodeRecord, SwarmDHT

logger = logging.getLogger(__name__)


class ViewListener(Protocol):
    def peer_joined(self, record: NodeRecord) -> None: ...

    def peer_updated(self, record: NodeRecord) -> None: ...

    def peer_left(self, peer: str, record: NodeRecord | None) -> None: ...


class SwarmView:
    """Live records of the run's other nodes (``leaving`` ones excluded), kept fresh."""

    def __init__(self, dht: SwarmDHT, run_id: str, heartbeat_s: float, admitted: AdmittedPeers | None = None) -> None:
        self.dht = dht
        self.run_id = run_id
        self.self_id = dht.peer_id
        self.heartbeat_s = heartbeat_s
        self.admitted = admitted  # a permissioned run: only its creator's admitted peers are seen (``admitted``)
        self.records: dict[str, NodeRecord] = {}
        self.seen: dict[str, NodeRecord] = {}  # every peer's latest record read, kept after it expired (``PeerBook``)
        self._listener: ViewListener | None = None
        self._poke = asyncio.Event()
        self.rounds = 0
        self.news_at = 0.0  # (monotonic) when a read last showed a peer's record newer than before: DHT contact

    async def publish(self, record: NodeRecord) -> None:
        await self.dht.publish_node(record, heartbeat_s=self.heartbeat_s)

    async def refresh(self) -> dict[str, NodeRecord]:
        """Read the run's records and report changes; returns the live records."""
        if self.admitted is not None:
            await self.admitted.update(self.dht)
        nodes = await self.dht.read_nodes(self.run_id)
        live = {p: r for p, r in nodes.items() if p != self.self_id and r.state != "leaving"
                and (self.admitted is None or self.admitted.allows(p))}
        listener = self._listener
        for peer in [p for p in self.records if p not in live]:
            gone = self.records.pop(peer)
            if listener is not None:
                listener.peer_left(peer, nodes.get(peer, gone))
        for peer, record in sorted(live.items()):
            known = self.records.get(peer)
            if known is None or record.updated_at > known.updated_at:
                self.news_at = time.monotonic()
            self.records[peer] = self.seen[peer] = record
            if listener is None:
                continue
            if known is None:
                listener.peer_joined(record)
            elif known != record:
                listener.peer_updated(record)
        self.rounds += 1
        return self.records

    def follow(self, listener: ViewListener) -> None:
        """From now on, report changes to ``listener``; the peers already known are reported as joined."""
        self._listener = listener
        for record in list(self.records.values()):
            listener.peer_joined(record)

    def forget(self, peer: str) -> None:
        """Drop ``peer`` until the next read shows it again (then it is reported as joined anew)."""
        self.records.pop(peer, None)

    def online(self, stage: int) -> list[str]:
        """Online peers of ``stage`` (sorted)."""
        return [r.peer_id for r in self.by_stage(stage) if r.state == "online"]

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
