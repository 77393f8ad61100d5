"""Outages: a node that lost every peer (its home network is down) keeps dialling until it is back.

``OutageClock`` (pure, times passed in) decides: a node that knows peers is *cut off* when, for
``outage_after_s``, no peer answered a ping and no DHT read showed any peer's record newer than
before; it is *back* once either happens again. ``OutageWatch`` checks every second; while cut off it dials, with a
growing pause (``reconnect_every_s`` .. ``reconnect_max_s``), its initial peers and the last known
addresses of the swarm's nodes, puts them back into the DHT's routing table (``SwarmDHT.rejoin``)
and asks the view to read again. Events: ``outage`` and ``reconnected``. A node that was cut off
publishes itself ``joining`` (peers do not route to it) and must re-sync its part before it steps and
serves again (``aggregation/resync.py`` asks ``was_cut_off`` and puts it back ``online``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.events import Events
from gwtfp2p.daemon.progress import NodeProgress
from gwtfp2p.dht import DHTError, NodeRecord
from gwtfp2p.transport import TransportError

logger = logging.getLogger(__name__)
CHECK_EVERY_S = 1.0
BACKOFF = 1.5
MAX_DIALLED = 24  # addresses dialled per attempt


@dataclass
class OutageClock:
    """Pure: whether the node is cut off, from when it last had news of the swarm."""

    outage_after_s: float
    started_at: float  # the node serves from here (no news before is not an outage)
    since: float | None = None  # when the current outage was declared

    def update(self, last_news: float, now: float, peers_known: int = 1) -> str | None:
        """``"outage"`` when one starts, ``"back"`` when it ends, else None. A node that never knew a
        peer (the first node of a swarm, alone) has nobody to lose: no outage."""
        last = max(last_news, self.started_at)
        if self.since is None and peers_known and now - last > self.outage_after_s:
            self.since = now
            return "outage"
        if self.since is not None and last > self.since:
            self.since = None
            return "back"
        return None


def redial_targets(initial_peers: Sequence[str], records: Sequence[NodeRecord]) -> list[str]:
    """What to dial during an outage: the initial peers, then every known node's addresses (``/p2p/<id>``)."""
    known = [m if m.endswith(f"/p2p/{r.peer_id}") else f"{m}/p2p/{r.peer_id}" for r in records for m in r.maddrs]
    return list(dict.fromkeys([*initial_peers, *known]))[:MAX_DIALLED]


class Rejoiner(Protocol):
    async def rejoin(self, maddrs: Sequence[str], timeout_s: float = 5.0) -> int: ...


class Dialer(Protocol):
    async def connect(self, peer_id: str, maddrs: Sequence[str], *, timeout_s: float) -> None: ...


class OutageWatch:
    """Declares outages, re-dials during them, and remembers that the node was cut off."""

    def __init__(self, *, dht: Rejoiner, dialer: Dialer, initial_peers: Sequence[str],
                 records: Callable[[], list[NodeRecord]], last_news: Callable[[], float], poke: Callable[[], None],
                 progress: NodeProgress, events: Events, timings: Timings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dht = dht
        self.dialer = dialer
        self.initial_peers = tuple(initial_peers)
        self.records = records  # the last known records of the swarm's nodes (the view keeps them)
        self.last_news = last_news  # when a peer last answered or showed a newer record
        self.poke = poke
        self.progress = progress  # an outage turns our record "joining": nobody routes to us until we re-sync
        self.events = events
        self.timings = timings
        self.clock = clock
        self.state = OutageClock(timings.outage_after_s, clock())
        self.was_cut_off = False  # set by an outage; cleared once the part re-synced (``resynced``)
        self._known: dict[str, NodeRecord] = {}
        self._pause, self._next_try = timings.reconnect_every_s, 0.0

    def resynced(self) -> None:
        self.was_cut_off = False

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), CHECK_EVERY_S)
            await self.check()

    async def check(self) -> None:
        """One look at the clock: declare or end an outage, redial when due."""
        now = self.clock()
        if self.state.since is None:
            self._known.update({r.peer_id: r for r in self.records()})
        outage_since = self.state.since
        change = self.state.update(self.last_news(), now, len(self._known))
        if change == "outage":
            self.was_cut_off = True
            if self.progress.state == "online":
                self.progress.state = "joining"
            logger.warning("no peer answered and no record changed for %.0f s: the swarm is lost; redialling",
                           self.timings.outage_after_s)
            self.events.emit("outage", peers_known=len(self._known), after_s=self.timings.outage_after_s)
            self._pause, self._next_try = self.timings.reconnect_every_s, now
        elif change == "back" and outage_since is not None:
            logger.warning("the swarm answers again after %.1f s", now - outage_since)
            self.events.emit("reconnected", outage_s=round(now - outage_since, 3))
        if self.state.since is not None and now >= self._next_try:
            await self._redial()
            self._next_try = now + self._pause
            self._pause = min(self._pause * BACKOFF, self.timings.reconnect_max_s)

    async def _redial(self) -> None:
        targets = redial_targets(self.initial_peers, list(self._known.values()))
        timeout_s = self.timings.connect_timeout_s
        try:
            answered = await self.dht.rejoin(targets, timeout_s)
        except DHTError as e:
            logger.info("rejoining the DHT failed: %s", e)
            answered = 0
        async def connect(record: NodeRecord) -> None:
            with contextlib.suppress(TransportError):
                await self.dialer.connect(record.peer_id, record.maddrs, timeout_s=timeout_s)

        await asyncio.gather(*(connect(r) for r in list(self._known.values())[:MAX_DIALLED] if r.maddrs))
        logger.info("outage: %d of %d addresses answered a DHT ping", answered, len(targets))
        self.poke()
