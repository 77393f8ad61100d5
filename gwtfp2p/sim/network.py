"""Simulated network: per-pair latency and bandwidth, transfers serialized per link direction.

Variants: ``geo10`` (the ten-region table: latency and bandwidth by the nodes' locations),
``uniform`` (one link everywhere), ``home`` (geo10 latencies behind home broadband access links:
per-direction bandwidth = min(region link, sender's uplink, receiver's downlink), and a node's
uploads share its uplink), ``lab`` (one LAN with the uniform latency, every node's uploads sharing
one uplink capped at ``lab_uplink_mbit``, downlinks free: the local swarm of
``benchmarks/bench_bandwidth.py``, network namespaces shaped by ``tc tbf``) and ``ideal`` (no
latency, unlimited bandwidth). A bulk transfer of S bytes from a to b leaves when the a→b
direction (and, for ``home`` and ``lab``, a's uplink: one queue for all its uploads) is free,
occupies it S/bandwidth seconds and arrives one latency later. Control messages (a few hundred
bytes) are not queued behind bulk data: they take latency + size/bandwidth. Owns no events and no
routing.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gwtfp2p.config import ConfigError
from gwtfp2p.flow.geo import GeoTable, geo10

NETWORK_KINDS = ("geo10", "uniform", "home", "lab", "ideal")
SHARED_UPLINK_KINDS = ("home", "lab")  # a node's uploads queue on its one uplink
MBIT = 1e6 / 8  # bytes per second in one Mbit/s
CONTROL_BYTES = 300  # a flow-protocol message, an ack, a resend request
IDEAL_BANDWIDTH = 1e15


@dataclass(frozen=True)
class NetworkSpec:
    """Which network variant, with its numbers (see docs/sim.md for their sources)."""

    kind: str = "geo10"
    uniform_latency_s: float = 0.05
    uniform_bandwidth_bytes_per_s: float = 1000 * MBIT
    home_uplink_mbit: tuple[float, ...] = (20.0, 40.0, 100.0)
    home_downlink_mbit: tuple[float, ...] = (100.0, 300.0, 1000.0)
    lab_uplink_mbit: float = 50.0
    """``lab``: every node's uplink (payload Mbit/s); its downlink is not capped, as under ``tc tbf`` on egress."""

    def __post_init__(self) -> None:
        if self.kind not in NETWORK_KINDS:
            raise ConfigError(f"--network: unknown network {self.kind!r}; choose one of {', '.join(NETWORK_KINDS)}")
        if self.uniform_latency_s < 0 or self.uniform_bandwidth_bytes_per_s <= 0:
            raise ConfigError("--network: uniform latency must be >= 0 and bandwidth > 0")
        if not self.home_uplink_mbit or not self.home_downlink_mbit or min(
                self.home_uplink_mbit + self.home_downlink_mbit) <= 0:
            raise ConfigError("--network: home access links need positive up/down rates")
        if not (self.lab_uplink_mbit > 0 and self.lab_uplink_mbit < float("inf")):
            raise ConfigError("--network: the lab uplink must be a positive finite Mbit/s, "
                              f"got {self.lab_uplink_mbit!r}")

    @property
    def shared_uplink(self) -> bool:
        """Whether a node's uploads queue on one uplink (its access link) rather than per destination."""
        return self.kind in SHARED_UPLINK_KINDS

    def draw_access(self, rng: random.Random) -> tuple[float, float]:
        """(uplink, downlink) in bytes/s for one home or lab node (0, 0 for other variants)."""
        if self.kind == "lab":
            return (self.lab_uplink_mbit * MBIT, IDEAL_BANDWIDTH)
        if self.kind != "home":
            return (0.0, 0.0)
        return (rng.choice(self.home_uplink_mbit) * MBIT, rng.choice(self.home_downlink_mbit) * MBIT)


class Network:
    """Links between the nodes it knows; bulk transfers queue per direction."""

    def __init__(self, spec: NetworkSpec, geo: GeoTable | None = None) -> None:
        self.spec = spec
        self.geo = geo or geo10()
        self.location: dict[str, str] = {}
        self.access: dict[str, tuple[float, float]] = {}
        self._pair: dict[tuple[str, str], tuple[float, float]] = {}
        self._link_free: dict[tuple[str, str], float] = {}
        self._uplink_free: dict[str, float] = {}
        self._shared_uplink = spec.shared_uplink
        self.bulk_bytes = 0.0
        self.control_bytes = 0.0

    def add_node(self, node_id: str, location: str, access: tuple[float, float] = (0.0, 0.0)) -> None:
        if self.spec.kind in ("geo10", "home") and location not in self.geo.locations:
            raise ConfigError(f"--network: unknown location {location!r}; known: {', '.join(self.geo.locations)}")
        self.location[node_id] = location
        self.access[node_id] = access

    def link(self, a: str, b: str) -> tuple[float, float]:
        """(one-way latency s, bandwidth bytes/s) of the direction a → b."""
        key = (a, b)
        cached = self._pair.get(key)
        if cached is None:
            cached = self._pair[key] = self._compute_link(a, b)
        return cached

    def _compute_link(self, a: str, b: str) -> tuple[float, float]:
        kind = self.spec.kind
        if kind == "ideal":
            return 0.0, IDEAL_BANDWIDTH
        if kind == "uniform":
            return self.spec.uniform_latency_s, self.spec.uniform_bandwidth_bytes_per_s
        if kind == "lab":
            return self.spec.uniform_latency_s, min(self.access[a][0], self.access[b][1])
        latency, bandwidth = self.geo.link(self.location[a], self.location[b])
        if kind == "home":
            bandwidth = min(bandwidth, self.access[a][0], self.access[b][1])
        return latency, bandwidth

    def transfer(self, a: str, b: str, size_bytes: float, now: float) -> tuple[float, float, float]:
        """Queue a bulk transfer: returns (when it starts, when its last byte leaves a, when it arrives)."""
        key = (a, b)
        cached = self._pair.get(key)
        latency, bandwidth = cached if cached is not None else self.link(a, b)
        free = self._link_free.get(key, 0.0)
        start = free if free > now else now
        if self._shared_uplink:
            uplink = self._uplink_free.get(a, 0.0)
            start = uplink if uplink > start else start
            depart = start + size_bytes / bandwidth
            self._uplink_free[a] = depart
        else:
            depart = start + size_bytes / bandwidth
        self._link_free[key] = depart
        self.bulk_bytes += size_bytes
        return start, depart, depart + latency

    def control_delay(self, a: str, b: str, size_bytes: float = CONTROL_BYTES) -> float:
        latency, bandwidth = self.link(a, b)
        self.control_bytes += size_bytes
        return latency + size_bytes / bandwidth

    def round_trip_s(self, a: str, b: str) -> float:
        return self.link(a, b)[0] + self.link(b, a)[0]
