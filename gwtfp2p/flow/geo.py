"""The geo10 reference data: ten cloud regions, pairwise latency/bandwidth, compute factors.

Loaded once from the packaged ``gwtfp2p/data/geo10.json`` (a copy of the shared reference data).
Owns lookups only; the simulator's network model and link emulation build on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

GIB = 2**30


@dataclass(frozen=True)
class GeoTable:
    """Per-pair one-way latency (s) and bandwidth (bytes/s); per-location compute factor."""

    locations: tuple[str, ...]
    latency_s: dict[tuple[str, str], float]
    bandwidth_bytes_per_s: dict[tuple[str, str], float]
    compute_factor: dict[str, float]
    local_latency_s: float
    local_bandwidth_bytes_per_s: float

    def link(self, a: str, b: str) -> tuple[float, float]:
        """(latency_s, bandwidth_bytes_per_s) between two locations (same location: local link)."""
        if a == b:
            return self.local_latency_s, self.local_bandwidth_bytes_per_s
        key = (a, b) if (a, b) in self.latency_s else (b, a)
        if key not in self.latency_s:
            raise KeyError(f"unknown location pair {a!r}, {b!r}; known: {', '.join(self.locations)}")
        return self.latency_s[key], self.bandwidth_bytes_per_s[key]

    def transfer_s(self, a: str, b: str, size_bytes: float) -> float:
        """One transfer of ``size_bytes`` from a to b: latency + size / bandwidth."""
        latency_s, bandwidth = self.link(a, b)
        return latency_s + size_bytes / bandwidth


@lru_cache(maxsize=1)
def geo10() -> GeoTable:
    """The packaged geo10 table."""
    raw = json.loads(resources.files("gwtfp2p").joinpath("data/geo10.json").read_text())
    latency = {}
    bandwidth = {}
    for link in raw["links"]:
        key = (str(link["a"]), str(link["b"]))
        latency[key] = float(link["latency_ms"]) / 1000.0
        bandwidth[key] = float(link["bandwidth_gbytes_per_s"]) * GIB
    local = raw["local_link"]
    return GeoTable(
        locations=tuple(raw["locations"]),
        latency_s=latency,
        bandwidth_bytes_per_s=bandwidth,
        compute_factor={str(k): float(v) for k, v in raw["compute_factor"].items()},
        local_latency_s=float(local["latency_ms"]) / 1000.0,
        local_bandwidth_bytes_per_s=float(local["bandwidth_gbytes_per_s"]) * GIB,
    )
