"""Who the swarm's peers are, as their signed DHT records proved it: stage, role and identity key.

``PeerBook`` remembers every record the view has shown (a peer whose record just expired can still
be checked, e.g. a crashed replica's contribution that another member forwards), signs this node's
messages with its identity key and verifies other peers' signatures with the public key their
record was signed with (``gwtfp2p.dht.identity``). With signatures off (a swarm run to measure their
cost) nothing is signed and every signature passes. No I/O: the view is read, never refreshed.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gwtfp2p.dht import NodeRecord
from gwtfp2p.dht.identity import NodeKey, verify

SIGNATURE_CHUNK_CHARS = 128  # a transfer tag's longest string value


@dataclass(frozen=True)
class Known:
    role: str
    stage: int
    public_key: bytes


def split_signature(signature: bytes) -> dict[str, str]:
    """A signature as tags ``sig0``, ``sig1``, ... of at most ``SIGNATURE_CHUNK_CHARS`` base64 characters."""
    text = base64.b64encode(signature).decode()
    return {f"sig{i}": text[start:start + SIGNATURE_CHUNK_CHARS]
            for i, start in enumerate(range(0, len(text), SIGNATURE_CHUNK_CHARS))}


def joined_signature(tags: Mapping[str, object]) -> bytes:
    """The signature ``split_signature`` cut into tags (b"" if missing or malformed)."""
    parts = []
    for i in range(8):
        part = tags.get(f"sig{i}")
        if not isinstance(part, str):
            break
        parts.append(part)
    try:
        return base64.b64decode("".join(parts), validate=True)
    except (binascii.Error, ValueError):
        return b""


class PeerBook:
    """Every peer's role, stage and public key seen in the view; our signatures and the check of theirs."""

    def __init__(self, self_id: str, key: NodeKey | None, records: Callable[[], Mapping[str, NodeRecord]],
                 signing: bool) -> None:
        self.self_id = self_id
        self.key = key
        self.records = records  # every record the view read (``SwarmView.seen``: kept after it expired)
        self.signing = signing and key is not None
        self._known: dict[str, Known] = {}
        self._seen: dict[str, NodeRecord] = {}

    def _refresh(self) -> None:
        for peer, record in self.records().items():
            if self._seen.get(peer) is record:
                continue
            self._seen[peer] = record
            old = self._known.get(peer)
            public = base64.b64decode(record.public_key) if record.public_key else (old.public_key if old else b"")
            self._known[peer] = Known(record.role, record.stage, public)

    def get(self, peer: str) -> Known | None:
        """What the latest record of ``peer`` seen said (None: never seen)."""
        if peer not in self._known:
            self._refresh()
        return self._known.get(peer)

    def serves(self, peer: str, stage: int) -> bool:
        """Whether ``peer``'s record (its latest seen) says it serves ``stage`` (0: a data holder)."""
        self._refresh()
        known = self._known.get(peer)
        return known is not None and known.stage == stage and (known.role == "data") == (stage == 0)

    def sign(self, message: bytes) -> bytes:
        return self.key.sign(message) if self.signing and self.key is not None else b""

    def verify(self, peer: str, message: bytes, signature: bytes) -> bool:
        """Whether ``peer`` signed ``message`` (always True with signatures off)."""
        if not self.signing:
            return True
        known = self.get(peer)
        return known is not None and bool(known.public_key) and verify(peer, known.public_key, message, signature)
