"""The daemon's one timeout model: every adaptive deadline, from measured figures and ``Timings``.

Pure arithmetic, no I/O. A *transfer* (or ping) deadline, until the receiver's answer, is
``k × (RTT + size / bandwidth + emulated delay)``; a *backward* deadline, until the gradient of a
microbatch we sent on comes back, is ``k × expected round trip``: the measured one (EMA of send →
gradient) or, before any measurement, a model ``hops × (2 × link time + downstream compute × queue
depth)``. Every deadline has a floor; a backward deadline that passes only triggers a liveness probe
of the next hop, and each probe that finds it alive doubles the deadline up to a cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from gwtfp2p.daemon.config import Timings


@dataclass(frozen=True)
class RoundTripModel:
    """What a microbatch sent to the next hop should need until its gradient is back, before any
    measurement: ``hops`` hops downstream and back (the next relays and the tail), each costing two
    link crossings and the downstream compute of the microbatches queued before it."""

    hops: int
    link_s: float  # one crossing: rtt/2 + size / bandwidth (+ emulated delay)
    compute_s: float  # forward + backward of one microbatch at the next hop (its DHT record)
    queue_depth: int  # microbatches this node has in flight (ahead of this one at worst)

    def expected_s(self) -> float:
        return max(1, self.hops) * (2 * self.link_s + self.compute_s * max(1, self.queue_depth))


class Deadlines:
    """The formulas above with one node's ``Timings``; every component that waits on a peer asks here."""

    def __init__(self, timings: Timings) -> None:
        self.timings = timings

    def transfer_s(self, rtt_s: float | None, size_bytes: int, bandwidth_bytes_per_s: float,
                   emulated_s: float = 0.0) -> float:
        """Until the receiver's answer: ``max(floor, k × (rtt + size/bw + emulated))``."""
        t = self.timings
        wire_s = size_bytes / bandwidth_bytes_per_s if bandwidth_bytes_per_s > 0 else 0.0
        expected = (rtt_s or 0.0) + wire_s + max(0.0, emulated_s)
        return max(t.transfer_floor_s, t.timeout_factor * expected)

    def ping_s(self, rtt_s: float | None, emulated_s: float = 0.0) -> float:
        """A verdict ping (no payload): the transfer deadline of zero bytes."""
        return self.transfer_s(rtt_s, 0, 0.0, emulated_s)

    def probe_s(self, rtt_s: float | None) -> float:
        """A routine ping, whose failure only raises a suspicion: at least ``probe_floor_s``."""
        return max(self.timings.probe_floor_s, self.ping_s(rtt_s))

    def backward_s(self, measured_s: float | None, model: RoundTripModel) -> float:
        """How long to wait for a gradient before probing the next hop: ``max(floor, k × expected)``,
        the expected round trip being the larger of the measured EMA and the model; at most the cap."""
        t = self.timings
        expected = max(measured_s or 0.0, model.expected_s())
        return min(t.backward_cap_s, max(t.backward_floor_s, t.timeout_factor * expected))

    def extended_s(self, current_s: float) -> float:
        """The next hop answered a probe: wait twice as long (up to the cap) before probing again."""
        return min(self.timings.backward_cap_s, 2 * current_s)

    def query_s(self, rtts_s: list[float | None]) -> float:
        """How long to wait for the answers to a recovery query (small messages): ``max(floor, k × max RTT)``."""
        known = [r for r in rtts_s if r is not None]
        return max(self.timings.query_floor_s, self.timings.timeout_factor * max(known, default=0.0))
