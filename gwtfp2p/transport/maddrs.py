"""Multiaddrs as p2pd reads them, relay circuits included.

The multiaddr package hivemind uses encodes a ``/p2p/<peer id>`` component as a CID, where p2pd (Go)
expects the peer id's multihash; p2pd then refuses the address ("length greater than remaining number
of bytes in buffer"). Plain addresses lose their trailing ``/p2p/`` before a dial; a relay circuit
(``/ip4/R/tcp/P/p2p/<relay>/p2p-circuit``) needs the relay's id inside it, so ``for_p2pd`` encodes
``/p2p/`` components the Go way and everything else with the package's own encoder.
"""

from __future__ import annotations

from dataclasses import dataclass

from hivemind.p2p import PeerID
from hivemind.utils.multiaddr import Multiaddr

P2P_CODE = 421  # multicodec of /p2p (and /ipfs)
CIRCUIT = "/p2p-circuit"


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@dataclass(frozen=True)
class EncodedMaddr:
    """What p2pd's control protocol takes for an address (hivemind's bindings call ``to_bytes``)."""

    text: str
    raw: bytes

    def to_bytes(self) -> bytes:
        return self.raw

    def __str__(self) -> str:
        return self.text


def for_p2pd(maddr: str, *, dial_peer: str | None = None) -> EncodedMaddr:
    """``maddr`` encoded for p2pd; ``ValueError`` on garbage. With ``dial_peer``, a trailing
    ``/p2p/<dial_peer>`` is dropped (p2pd's connect takes the peer id separately)."""
    text = maddr.rstrip("/")
    if dial_peer is not None and text.endswith(f"/p2p/{dial_peer}"):
        text = text[: -len(f"/p2p/{dial_peer}")]
    tokens = text.strip("/").split("/")
    raw, plain = bytearray(), []
    i = 0
    while i < len(tokens):
        if tokens[i] in ("p2p", "ipfs"):
            if i + 1 >= len(tokens):
                raise ValueError(f"{maddr!r}: /p2p/ without a peer id")
            if plain:
                raw += Multiaddr("/" + "/".join(plain)).to_bytes()
                plain = []
            multihash = PeerID.from_base58(tokens[i + 1]).to_bytes()
            raw += _uvarint(P2P_CODE) + _uvarint(len(multihash)) + multihash
            i += 2
            continue
        plain.append(tokens[i])
        i += 1
    if plain:
        raw += Multiaddr("/" + "/".join(plain)).to_bytes()
    if not raw:
        raise ValueError(f"{maddr!r} is not a multiaddr")
    return EncodedMaddr(text, bytes(raw))


def is_relayed(maddr: str) -> bool:
    return CIRCUIT in maddr


def circuit_via(relay_maddr: str, peer_id: str) -> str:
    """The address of ``peer_id`` through the relay at ``relay_maddr`` (which ends in ``/p2p/<relay id>``)."""
    if "/p2p/" not in relay_maddr or is_relayed(relay_maddr):
        raise ValueError(f"a relay address ends in /p2p/<relay id> and is not itself relayed: {relay_maddr!r}")
    return f"{relay_maddr}{CIRCUIT}/p2p/{peer_id}"
