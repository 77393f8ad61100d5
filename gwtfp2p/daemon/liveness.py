"""Which peers this node holds for dead, and when a dead peer counts as alive again.

Pure bookkeeping, no I/O. A peer is declared dead after a failed liveness probe (``PeerManager``
pings it when its DHT record expired, when transfers or flow messages to it fail, or when a
gradient it owes is late). Its DHT record lingers until it expires; such a stale record must not
bring it back. Only a *newer* heartbeat (``updated_at`` past the one seen when it was declared
dead) does: a peer that was merely cut off for a while is alive again.
"""

from __future__ import annotations


class DeadPeers:
    def __init__(self) -> None:
        self._dead: dict[str, float] = {}  # peer -> updated_at of its last record seen before death
        self._seen: dict[str, float] = {}  # peer -> updated_at of its latest record

    def seen(self, peer: str, updated_at: float) -> bool:
        """A record of ``peer`` was read; True if it may be used (the peer is not dead, or this
        record is newer than its death, which revives it)."""
        self._seen[peer] = max(updated_at, self._seen.get(peer, updated_at))
        dead_at = self._dead.get(peer)
        if dead_at is None:
            return True
        if updated_at > dead_at:
            del self._dead[peer]
            return True
        return False

    def declare(self, peer: str) -> bool:
        """Declare ``peer`` dead; True if it was not already."""
        if peer in self._dead:
            return False
        self._dead[peer] = self._seen.get(peer, 0.0)
        return True

    def is_dead(self, peer: str) -> bool:
        return peer in self._dead

    def __len__(self) -> int:
        return len(self._dead)
