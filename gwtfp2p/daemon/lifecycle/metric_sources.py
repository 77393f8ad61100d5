"""What ``NodeMetrics`` reads from the serving components: narrow, read-only views of them.

Each protocol names the few attributes a figure needs (the gate's iteration, a relay's work counters,
the sender's traffic, the compute thread's busy time, the join's download), so the metrics know no
component's class and the components know nothing of the metrics.
"""

from __future__ import annotations

from typing import Protocol

from gwtfp2p.daemon.lifecycle.self_report import FlowNeighbours


class Iteration(Protocol):
    iteration: int


class WorkCounters(Protocol):
    forwards: int
    backwards: int
    in_flight: int


class SentTraffic(Protocol):
    """Acknowledged transfers sent, and their wire bytes, by kind (the sender's ``Traffic``)."""

    forwards: int
    forward_bytes: int
    backwards: int
    backward_bytes: int
    aggregation_messages: int
    aggregation_bytes: int


class Sent(Protocol):
    traffic: SentTraffic


class Busy(Protocol):
    busy_s: float


class Joined(Protocol):
    source: str  # initial | replica | checkpoint
    state_bytes: int
    download_s: float
    replayed_steps: int


class Routing(FlowNeighbours, Protocol):
    messages_in: int

    def summary(self) -> list[tuple[str, str, int]]: ...
