"""Link emulation for local swarms (``--location NAME``): delay messages as geo10 links would.

A message of S bytes between locations a and b is delayed by
``scale × (latency(a, b) + S / bandwidth(a, b))`` (geo10's transfer model; the table itself is
``gwtfp2p.flow.geo``). The delay is applied by the sender (inside the transport client, before a
request leaves and as a reply arrives), so the receiving side needs no cooperation. Owns location
names, peer locations and the delay arithmetic.
"""

from __future__ import annotations

import asyncio
import logging
import math

from gwtfp2p.config import ConfigError
from gwtfp2p.flow.geo import GeoTable, geo10

logger = logging.getLogger(__name__)


def canonical_location(table: GeoTable, name: str, flag: str = "--location") -> str:
    """The table's spelling of a location name (case-insensitive); ``ConfigError`` if unknown."""
    for location in table.locations:
        if location.lower() == name.strip().lower():
            return location
    raise ConfigError(f"{flag}: unknown location {name!r}; choose one of {', '.join(table.locations)}")


class LinkEmulator:
    """Delays this node's messages to each peer by the emulated link between their locations.

    The daemon tells it where peers are (``set_peer_location``, from their DHT records); messages to
    a peer of unknown location are not delayed.
    """

    def __init__(self, own_location: str, scale: float = 1.0, table: GeoTable | None = None):
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
            raise ConfigError(f"--link-scale: must be a finite number >= 0, got {scale!r}")
        self.table = table or geo10()
        self.own_location = canonical_location(self.table, own_location)
        self.scale = float(scale)
        self._peer_locations: dict[str, str] = {}

    def set_peer_location(self, peer_id: str, location: str | None) -> None:
        """Record (or, with None/"", forget) where ``peer_id`` is; unknown names are ignored (logged)."""
        if not location:
            self._peer_locations.pop(peer_id, None)
            return
        try:
            self._peer_locations[peer_id] = canonical_location(self.table, location)
        except ConfigError:
            logger.debug("peer %s claims unknown location %r; not emulating its link", peer_id, location)
            self._peer_locations.pop(peer_id, None)

    def peer_location(self, peer_id: str) -> str | None:
        return self._peer_locations.get(peer_id)

    def delay_s(self, peer_id: str, size_bytes: int, include_latency: bool = True) -> float:
        """Seconds to hold a message of ``size_bytes`` to/from ``peer_id`` (0 if its location is unknown)."""
        location = self._peer_locations.get(peer_id)
        if location is None or self.scale == 0.0:
            return 0.0
        latency_s, bandwidth_bytes_per_s = self.table.link(self.own_location, location)
        latency_s = latency_s if include_latency else 0.0
        return self.scale * (latency_s + max(0, size_bytes) / bandwidth_bytes_per_s)

    async def delay(self, peer_id: str, size_bytes: int, include_latency: bool = True) -> None:
        """Sleep for ``delay_s(...)`` (returns at once when there is nothing to emulate)."""
        seconds = self.delay_s(peer_id, size_bytes, include_latency)
        if seconds > 0:
            await asyncio.sleep(seconds)
