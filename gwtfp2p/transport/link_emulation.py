"""Link emulation for local swarms (``--location NAME``): delay messages as geo10 links would.

A message of S bytes from location a to location b is delayed by
``scale × (latency(a, b) + S / bandwidth(a, b))`` (geo10's transfer model). The delay is applied by
the sender (inside the transport client, before a request leaves and after a reply arrives), so the
receiving side needs no cooperation. Owns the geo10 table lookup and the delay arithmetic.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from gwtfp2p.config import ConfigError

logger = logging.getLogger(__name__)
GIB = 2**30


@dataclass(frozen=True)
class Link:
    """One direction of a link: latency in seconds, bandwidth in bytes per second."""

    latency_s: float
    bandwidth_bytes_per_s: float

    def transfer_s(self, size_bytes: int) -> float:
        return self.latency_s + size_bytes / self.bandwidth_bytes_per_s


@dataclass(frozen=True)
class GeoTable:
    """Pairwise links between named locations (symmetric); same-location pairs use ``local``."""

    locations: tuple[str, ...]
    links: dict[frozenset[str], Link]
    local: Link

    def canonical(self, name: str, flag: str = "--location") -> str:
        """The table's spelling of a location name (case-insensitive); ``ConfigError`` if unknown."""
        for location in self.locations:
            if location.lower() == name.strip().lower():
                return location
        raise ConfigError(f"{flag}: unknown location {name!r}; choose one of {', '.join(self.locations)}")

    def link(self, a: str, b: str) -> Link:
        if a == b:
            return self.local
        try:
            return self.links[frozenset((a, b))]
        except KeyError:
            raise ConfigError(f"--location: no geo10 link between {a!r} and {b!r}") from None


@lru_cache(maxsize=1)
def load_geo10() -> GeoTable:
    """The packaged geo10 table (``gwtfp2p/data/geo10.json``)."""
    raw = json.loads(resources.files("gwtfp2p").joinpath("data/geo10.json").read_text())

    def to_link(entry: dict) -> Link:
        return Link(latency_s=float(entry["latency_ms"]) / 1000.0,
                    bandwidth_bytes_per_s=float(entry["bandwidth_gbytes_per_s"]) * GIB)

    links = {frozenset((str(e["a"]), str(e["b"]))): to_link(e) for e in raw["links"]}
    return GeoTable(locations=tuple(raw["locations"]), links=links, local=to_link(raw["local_link"]))


class LinkEmulator:
    """Delays this node's messages to each peer by the emulated link between their locations.

    The daemon tells it where peers are (``set_peer_location``, from their DHT records); messages to
    a peer of unknown location are not delayed.
    """

    def __init__(self, own_location: str, scale: float = 1.0, table: GeoTable | None = None):
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
            raise ConfigError(f"--link-scale: must be a finite number >= 0, got {scale!r}")
        self.table = table or load_geo10()
        self.own_location = self.table.canonical(own_location)
        self.scale = float(scale)
        self._peer_locations: dict[str, str] = {}

    def set_peer_location(self, peer_id: str, location: str | None) -> None:
        """Record (or, with None/"", forget) where ``peer_id`` is; unknown names are ignored (logged)."""
        if not location:
            self._peer_locations.pop(peer_id, None)
            return
        try:
            self._peer_locations[peer_id] = self.table.canonical(location)
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
        link = self.table.link(self.own_location, location)
        latency_s = link.latency_s if include_latency else 0.0
        return self.scale * (latency_s + max(0, size_bytes) / link.bandwidth_bytes_per_s)

    async def delay(self, peer_id: str, size_bytes: int, include_latency: bool = True) -> None:
        """Sleep for ``delay_s(...)`` (returns at once when there is nothing to emulate)."""
        seconds = self.delay_s(peer_id, size_bytes, include_latency)
        if seconds > 0:
            await asyncio.sleep(seconds)
