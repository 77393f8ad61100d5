"""The node's one failure detector: who is dead, decided by probes, told to every component.

``DeadPeers`` is the pure bookkeeping: a peer declared dead stays dead until a *newer* DHT heartbeat
(``updated_at`` past the one seen when it was declared) revives it; its lingering record does not.
``Liveness`` probes: a peer is *suspected* when its record expires, transfers or messages to it fail,
a gradient it owes is late or a recovery reports it; a suspect is pinged (twice if the dial fails at
once, after dialing it at the addresses its record publishes: a peer behind a NAT is reached only
through its relay circuits, which p2pd may not know yet) within an adaptive deadline and, if silent,
declared dead; subscribers are told once. A peer
``exclude``d for misbehaviour (``exclusions``) is dead to us until its exclusion ends, heartbeats or not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from gwtfp2p.daemon.config import Timings
from gwtfp2p.daemon.swarm.exclusions import Exclusion, Exclusions
from gwtfp2p.daemon.swarm.links import LinkTable
from gwtfp2p.daemon.tasks import Background
from gwtfp2p.daemon.timeouts import Deadlines
from gwtfp2p.transport import PeerUnreachable, PingResult, RemoteError, TransportError

logger = logging.getLogger(__name__)


class DeadPeers:
    def __init__(self) -> None:
        self._dead: dict[str, float] = {}  # peer -> updated_at of its last record seen before death
        self._seen: dict[str, float] = {}  # peer -> updated_at of its latest record

    def seen(self, peer: str, updated_at: float) -> bool:
        """A record of ``peer`` was read; True if it may be used (the peer is not dead, or this
        record is newer than its death, which revives it)."""
        self._seen[peer] = max(updated_at, self._seen.get(peer, updated_at))
        dead_at = self._dead.get(peer)
        if dead_at is None:
            return True
        if updated_at > dead_at:
            del self._dead[peer]
            return True
        return False

    def declare(self, peer: str) -> bool:
        """Declare ``peer`` dead; True if it was not already."""
        if peer in self._dead:
            return False
        self._dead[peer] = self._seen.get(peer, 0.0)
        return True

    def is_dead(self, peer: str) -> bool:
        return peer in self._dead

    def __len__(self) -> int:
        return len(self._dead)


class Pinger(Protocol):
    async def ping(self, peer: str, *, timeout_s: float) -> PingResult: ...


class Redialer(Protocol):
    async def redial(self, peer: str, *, timeout_s: float) -> bool:
        """Open a connection to ``peer`` at the addresses its record publishes; whether one opened."""
        ...


class Liveness:
    """Probes suspects, declares the silent dead, and tells subscribers (in subscription order)."""

    def __init__(self, self_id: str, pinger: Pinger, links: LinkTable, deadlines: Deadlines,
                 timings: Timings, exclusions: Exclusions | None = None, redialer: Redialer | None = None) -> None:
        self.self_id = self_id
        self.pinger = pinger
        self.redialer = redialer  # None: a failed dial is only tried again after the pause
        self.links = links
        self.deadlines = deadlines
        self.retry_pause_s = timings.unreachable_retry_delays_s[0] if timings.unreachable_retry_delays_s else 0.0
        self.dead = DeadPeers()
        self.exclusions = exclusions or Exclusions(600.0, lambda: 0.0)
        self.background = Background("liveness")
        self._listeners: list[Callable[[str], None]] = []
        self._checking: set[str] = set()
        self.answer_at = 0.0  # (monotonic) when a peer last answered a ping: this node is not cut off

    def subscribe(self, listener: Callable[[str], None]) -> None:
        """``listener(peer)`` is called once for every peer declared dead from now on."""
        self._listeners.append(listener)

    def seen(self, peer: str, updated_at: float) -> bool:
        return self.dead.seen(peer, updated_at) and not self.exclusions.active(peer)

    def is_dead(self, peer: str) -> bool:
        return self.dead.is_dead(peer) or self.exclusions.active(peer)

    def exclude(self, peer: str, reason: str) -> Exclusion:
        """``peer`` misbehaved: dead to us (subscribers told) until its exclusion ends, whatever it answers."""
        exclusion = self.exclusions.add(peer, reason)
        logger.warning("peer %s excluded for %.0f s: %s", peer, exclusion.until - exclusion.since, reason)
        self.declare_dead(peer)
        return exclusion

    def suspect(self, peer: str) -> None:
        """Probe ``peer`` soon (once at a time); declare it dead if it does not answer."""
        if peer == self.self_id or self.dead.is_dead(peer) or peer in self._checking:
            return
        self._checking.add(peer)
        self.background.spawn(self.alive(peer), f"liveness of {peer}")

    async def alive(self, peer: str) -> bool:
        """Ping ``peer`` twice (if the first dial failed at once: after a pause and a dial at the addresses
        its record publishes); False, and it is declared dead, if neither ping is answered within its
        adaptive deadline. A busy peer that stalls one deadline (a loaded machine, a long step) is not
        declared dead: that would split its part; nor is a peer behind a NAT whose relay circuit p2pd did
        not know when we first dialed it (a replica that sends to a relayed one it has not introduced yet)."""
        if self.is_dead(peer):
            return False
        self._checking.add(peer)
        try:
            for attempt in range(2):
                ok, unreachable = await self._ping_once(peer)
                if ok:
                    return True
                if unreachable and attempt == 0:
                    await asyncio.sleep(self.retry_pause_s)
                    await self._redial(peer)
            self.declare_dead(peer)
            return False
        finally:
            self._checking.discard(peer)

    async def _redial(self, peer: str) -> None:
        if self.redialer is None:
            return
        opened = await self.redialer.redial(peer, timeout_s=self.deadlines.ping_s(self.links.rtt(peer)))
        logger.info("%s could not be dialed; dialed again at its record's addresses: %s", peer,
                    "connected" if opened else "no connection")

    async def ping(self, peer: str) -> bool:
        """One routine ping that measures the RTT; a failure is only reported (no verdict): introductions,
        probes, placement. Its deadline is the longer ``Deadlines.probe_s``."""
        ok, _ = await self._ping_once(peer, self.deadlines.probe_s(self.links.rtt(peer)))
        return ok

    async def _ping_once(self, peer: str, timeout_s: float | None = None) -> tuple[bool, bool]:
        """(answered, the dial failed at once)."""
        try:
            timeout_s = timeout_s if timeout_s is not None else self.deadlines.ping_s(self.links.rtt(peer))
            result = await self.pinger.ping(peer, timeout_s=timeout_s)
        except RemoteError as e:  # it answered, with an error: alive
            logger.debug("ping of %s answered with an error: %s", peer, e)
            return True, False
        except TransportError as e:
            logger.debug("ping of %s failed: %s", peer, e)
            return False, isinstance(e, PeerUnreachable)
        self.links.observe_rtt(peer, result.rtt_s)
        self.answer_at = time.monotonic()
        return True, False

    def declare_dead(self, peer: str) -> None:
        if not self.dead.declare(peer):
            return
        logger.warning("peer %s is dead (no answer to a liveness probe)", peer)
        for listener in list(self._listeners):
            listener(peer)

    async def close(self) -> None:
        await self.background.close()
