"""Adaptive deadlines of the data plane (DESIGN §3): never one fixed number, always with a floor.

Pure arithmetic, no I/O. A *transfer* deadline (until the receiver's ack) is
``k × (RTT + size / bandwidth + emulated delay)``; a *backward* deadline (until the gradient of a
microbatch we sent on comes back) is ``k × expected round trip``, where the expected round trip is
the measured one (EMA of this node's send → gradient times) or, before any measurement, a model:
``hops × (2 × link time + downstream compute × queue depth)``. Both are at least their floor. A
backward deadline that passes only triggers a liveness probe of the next hop; each probe that finds
it alive doubles the deadline (up to a cap).
"""

from __future__ import annotations

from dataclasses import dataclass

TIMEOUT_FACTOR = 4.0
TRANSFER_FLOOR_S = 2.0
BACKWARD_FLOOR_S = 2.0
BACKWARD_CAP_S = 120.0
QUERY_FLOOR_S = 1.0


def transfer_timeout_s(rtt_s: float | None, size_bytes: int, bandwidth_bytes_per_s: float, emulated_s: float = 0.0,
                       factor: float = TIMEOUT_FACTOR, floor_s: float = TRANSFER_FLOOR_S) -> float:
    """Deadline of one transfer until the receiver's ack: ``max(floor, k × (rtt + size/bw + emulated))``."""
    wire_s = size_bytes / bandwidth_bytes_per_s if bandwidth_bytes_per_s > 0 else 0.0
    expected = (rtt_s or 0.0) + wire_s + max(0.0, emulated_s)
    return max(floor_s, factor * expected)


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


def backward_deadline_s(measured_s: float | None, model: RoundTripModel, factor: float = TIMEOUT_FACTOR,
                        floor_s: float = BACKWARD_FLOOR_S) -> float:
    """How long to wait for a gradient before probing the next hop: ``max(floor, k × expected)``, the
    expected round trip being the larger of the measured EMA and the model."""
    expected = max(measured_s or 0.0, model.expected_s())
    return min(BACKWARD_CAP_S, max(floor_s, factor * expected))


def extended_deadline_s(current_s: float) -> float:
    """The next hop answered a probe: wait twice as long (up to the cap) before probing again."""
    return min(BACKWARD_CAP_S, 2 * current_s)


def query_timeout_s(rtts_s: list[float | None], factor: float = TIMEOUT_FACTOR,
                    floor_s: float = QUERY_FLOOR_S) -> float:
    """How long to wait for the answers to a recovery query (small messages): ``max(floor, k × max RTT)``."""
    known = [r for r in rtts_s if r is not None]
    return max(floor_s, factor * max(known, default=0.0))
