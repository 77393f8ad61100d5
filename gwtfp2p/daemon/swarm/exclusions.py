"""Peers this node excluded for misbehaviour (a liar, a peer that takes work and never delivers), and why.

Pure bookkeeping with an injected clock. An excluded peer counts as dead for ``exclude_s`` whatever its
heartbeats say (a dead peer is revived by a newer record, ``liveness.DeadPeers``; an excluded one is
not), then gets another chance. Every exclusion keeps its reason, which the node logs, announces as an
``excluded`` event and lists in ``gwtf status`` (the record's ``excluded``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Exclusion:
    peer: str
    reason: str
    since: float
    until: float


class Exclusions:
    def __init__(self, exclude_s: float, clock: Callable[[], float]) -> None:
        self.exclude_s = exclude_s
        self.clock = clock
        self._by_peer: dict[str, Exclusion] = {}

    def add(self, peer: str, reason: str) -> Exclusion:
        now = self.clock()
        exclusion = self._by_peer[peer] = Exclusion(peer, reason, now, now + self.exclude_s)
        return exclusion

    def active(self, peer: str) -> bool:
        exclusion = self._by_peer.get(peer)
        if exclusion is None:
            return False
        if self.clock() >= exclusion.until:
            del self._by_peer[peer]
            return False
        return True

    def current(self) -> list[Exclusion]:
        """The exclusions in force, oldest first."""
        return sorted((e for e in list(self._by_peer.values()) if self.active(e.peer)), key=lambda e: e.since)
