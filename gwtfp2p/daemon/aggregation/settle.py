"""When an aggregation round waits, whom it probes and whom it stops waiting for (pure, times passed in).

An online same-part peer that has not announced its membership holds the round back (its notice comes
when it discovers us) for at most ``unannounced_s``; then it is ignored for good. A member we wait for
longer than ``probe_after_s`` is probed (the failure detector decides), each at most every
``probe_every_s``, one probe at a time. Past the last-resort deadline the silent are dropped.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Iterable

from gwtfp2p.daemon.config import Timings


class SettlePolicy:
    """Bookkeeping of one part's rounds: ignored peers and probes in flight (no I/O, no clock)."""

    def __init__(self, timings: Timings) -> None:
        self.timings = timings
        self.ignored: set[str] = set()
        self.probing: set[str] = set()
        self.probed_at: dict[str, float] = {}

    def unannounced(self, online_peers: Iterable[str], members: Container[str], dead: Collection[str]) -> list[str]:
        """Online same-part peers that are neither members nor dead nor ignored."""
        return [p for p in online_peers if p not in members and p not in self.ignored and p not in dead]

    def holding(self, unannounced: list[str], waited_s: float) -> list[str]:
        """The unannounced peers the round still waits for; past ``unannounced_s`` none (ignored from now)."""
        if unannounced and waited_s > self.timings.unannounced_s:
            self.ignored.update(unannounced)
            return []
        return unannounced

    def to_probe(self, peers: Iterable[str], waited_s: float, now_s: float) -> list[str]:
        """Of ``peers`` we wait for, those to probe now (not before ``probe_after_s``, rate-limited)."""
        if waited_s < self.timings.probe_after_s:
            return []
        return [p for p in dict.fromkeys(peers) if p not in self.probing
                and now_s - self.probed_at.get(p, float("-inf")) >= self.timings.probe_every_s]

    def probe_started(self, peer: str, now_s: float) -> bool:
        """Note a probe of ``peer``; False if one is already under way."""
        if peer in self.probing:
            return False
        self.probing.add(peer)
        self.probed_at[peer] = now_s
        return True

    def probe_done(self, peer: str) -> None:
        self.probing.discard(peer)
