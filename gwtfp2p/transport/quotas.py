"""Per-peer shares of a server: no single peer can take all its bulk streams or its memory.

Pure bookkeeping. Every bulk request (a forward, a backward, a state download; over libp2p or the
direct channel) holds one of its peer's ``max_streams_per_peer`` slots while it is served, and a
tensor's announced size counts against its peer's ``max_peer_bytes`` until the handler took it. A
peer over its share gets ``busy`` at once, before its bytes are read; the others keep theirs.
"""

from __future__ import annotations

from collections import Counter


class PeerQuotas:
    def __init__(self, max_streams_per_peer: int, max_peer_bytes: int) -> None:
        self.max_streams_per_peer = max_streams_per_peer
        self.max_peer_bytes = max_peer_bytes
        self._streams: Counter[str] = Counter()
        self._bytes: Counter[str] = Counter()

    def take_stream(self, peer: str) -> bool:
        """One more request of ``peer`` in flight; False (nothing taken) past its share."""
        if self._streams[peer] >= self.max_streams_per_peer:
            return False
        self._streams[peer] += 1
        return True

    def give_stream(self, peer: str) -> None:
        self._streams[peer] -= 1
        if self._streams[peer] <= 0:
            del self._streams[peer]

    def take_bytes(self, peer: str, size_bytes: int) -> bool:
        """``size_bytes`` more of ``peer``'s tensors in memory; False (nothing taken) past its share."""
        if self._bytes[peer] + size_bytes > self.max_peer_bytes:
            return False
        self._bytes[peer] += size_bytes
        return True

    def give_bytes(self, peer: str, size_bytes: int) -> None:
        self._bytes[peer] -= size_bytes
        if self._bytes[peer] <= 0:
            del self._bytes[peer]

    def streams(self, peer: str) -> int:
        return self._streams[peer]
