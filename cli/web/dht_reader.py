"""Repeated reads of the swarm through one client-mode DHT, for the live page's poller.

``DHTReader.open`` joins the DHT as a client (no records of its own) on an event loop of its own;
each call then reads the current run and its node records within ``read_timeout_s`` and returns
``gwtf status --json``'s object. Only one thread may call it at a time (the poller); ``close``
leaves the DHT. A DHT process that died is started again on the next read.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvloop

from gwtfp2p.daemon.status import read_snapshot, summarize
from gwtfp2p.dht import DHTClosed, SwarmDHT

logger = logging.getLogger(__name__)

READ_TIMEOUT_S = 10.0


class DHTReader:
    def __init__(self, loop: asyncio.AbstractEventLoop, initial_peers: tuple[str, ...], startup_timeout_s: float,
                 read_timeout_s: float) -> None:
        self.loop = loop
        self.initial_peers = initial_peers
        self.startup_timeout_s = startup_timeout_s
        self.read_timeout_s = read_timeout_s
        self.dht: SwarmDHT | None = None

    @classmethod
    def open(cls, initial_peers: tuple[str, ...], startup_timeout_s: float = 30.0,
             read_timeout_s: float = READ_TIMEOUT_S) -> DHTReader:
        """Join the DHT now (call it before starting threads: the DHT process is forked)."""
        reader = cls(uvloop.new_event_loop(), initial_peers, startup_timeout_s, read_timeout_s)
        try:
            reader.dht = reader.loop.run_until_complete(reader._create())
        except BaseException:
            reader.loop.close()
            raise
        return reader

    async def _create(self) -> SwarmDHT:
        return await SwarmDHT.create(initial_peers=self.initial_peers, client_mode=True,
                                     startup_timeout_s=self.startup_timeout_s, call_timeout_s=self.read_timeout_s)

    async def _read(self) -> dict[str, Any]:
        if self.dht is None:
            self.dht = await self._create()
        try:
            snapshot = await read_snapshot(self.dht, self.read_timeout_s)
        except DHTClosed:
            logger.warning("the DHT process is gone; starting it again for the next read")
            dht, self.dht = self.dht, None
            await dht.shutdown()
            raise
        return summarize(snapshot)

    def __call__(self) -> dict[str, Any]:
        """One read of the swarm (``DHTError``, ``NoRunError`` on failure) within the read deadline."""
        return self.loop.run_until_complete(self._read())

    def close(self, timeout_s: float = 10.0) -> None:
        if self.dht is not None:
            dht, self.dht = self.dht, None
            self.loop.run_until_complete(dht.shutdown(timeout_s))
        self.loop.close()
