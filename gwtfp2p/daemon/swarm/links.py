"""Measured link figures and the flow's edge costs: RTT from pings, bandwidth from transfers.

Pure arithmetic over observations (no I/O): exponential moving averages of each neighbour's
round trip time and of the bandwidth seen on large transfers (a configured default until one is
seen), and the paper's edge cost ``d(i,j)`` from them (``gwtfp2p.flow.costs.edge_cost_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gwtfp2p.flow.costs import edge_cost_s

MIN_BANDWIDTH_SAMPLE_BYTES = 256 * 1024  # smaller transfers say nothing about bandwidth


class Ema:
    """Exponential moving average (the first sample initializes it)."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.value: float | None = None
        self.samples = 0

    def add(self, sample: float) -> float:
        if not math.isfinite(sample):
            return self.value if self.value is not None else 0.0
        self.value = sample if self.value is None else (1 - self.alpha) * self.value + self.alpha * sample
        self.samples += 1
        return self.value

    def get(self, default: float = 0.0) -> float:
        return default if self.value is None else self.value

    def cap(self, bound: float, default: float) -> None:
        """At most ``bound`` from now on (``default`` stands for the value while there is none): a limit
        learnt otherwise than by a sample (a timeout), so it counts as none."""
        if self.get(default) > bound:
            self.value = bound


@dataclass
class LinkEstimate:
    rtt: Ema
    bandwidth: Ema


class LinkTable:
    """Per-neighbour RTT and bandwidth estimates."""

    def __init__(self, default_bandwidth_bytes_per_s: float) -> None:
        self.default_bandwidth = default_bandwidth_bytes_per_s
        self._links: dict[str, LinkEstimate] = {}

    def _link(self, peer: str) -> LinkEstimate:
        if peer not in self._links:
            self._links[peer] = LinkEstimate(Ema(0.3), Ema(0.2))
        return self._links[peer]

    def observe_rtt(self, peer: str, rtt_s: float) -> None:
        self._link(peer).rtt.add(max(0.0, rtt_s))

    def observe_transfer(self, peer: str, size_bytes: int, seconds: float) -> None:
        """A transfer of ``size_bytes`` took ``seconds`` (until the receiver's ack)."""
        if size_bytes < MIN_BANDWIDTH_SAMPLE_BYTES:
            return
        link = self._link(peer)
        wire_s = max(seconds - link.rtt.get(0.0), 1e-4)
        link.bandwidth.add(size_bytes / wire_s)

    def observe_timeout(self, peer: str, size_bytes: int, seconds: float) -> None:
        """A transfer of ``size_bytes`` got no answer within ``seconds``: the link carries less than
        ``size_bytes / seconds``, and an estimate above that bound (the default, on a link never measured)
        drops to it; else every next deadline would be as short and time out too, and no sample ever come."""
        if size_bytes < MIN_BANDWIDTH_SAMPLE_BYTES or seconds <= 0:
            return
        bound = size_bytes / seconds
        self._link(peer).bandwidth.cap(bound, self.default_bandwidth)

    def forget(self, peer: str) -> None:
        self._links.pop(peer, None)

    def rtt(self, peer: str) -> float | None:
        link = self._links.get(peer)
        return None if link is None or link.rtt.value is None else link.rtt.value

    def bandwidth(self, peer: str) -> float:
        link = self._links.get(peer)
        return self.default_bandwidth if link is None else link.bandwidth.get(self.default_bandwidth)

    def measured_bandwidth(self, peer: str) -> float | None:
        """The bandwidth measured to ``peer``; None until a large transfer measured it."""
        link = self._links.get(peer)
        return None if link is None else link.bandwidth.value

    def peers(self) -> list[str]:
        return sorted(p for p, link in self._links.items() if link.rtt.value is not None)

    def edge_cost(self, peer: str, own_compute_s: float, peer_compute_s: float, size_bytes: float) -> float | None:
        """d(self, peer) in seconds, or None before the first RTT sample."""
        rtt = self.rtt(peer)
        if rtt is None:
            return None
        bandwidth = self.bandwidth(peer)
        return edge_cost_s(own_compute_s, peer_compute_s, rtt / 2, rtt / 2, bandwidth, bandwidth, size_bytes)


def activation_bytes(microbatch_size: int, seq_len: int, hidden: int, element_bytes: int = 4) -> int:
    """Bytes of one microbatch's hidden states crossing a hop."""
    return microbatch_size * seq_len * hidden * element_bytes
