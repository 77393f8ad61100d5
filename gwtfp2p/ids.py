"""Identifiers shared by every layer that parses network data: the one peer-id type of the package.

``PeerId`` is a libp2p peer id in base58 (``12D3KooW…`` or ``Qm…``) as a pydantic-validated string;
the DHT records, the transport's metadata and the daemon's messages all use it. No I/O.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

PEER_ID_PATTERN = r"^[1-9A-HJ-NP-Za-km-z]+$"

PeerId = Annotated[str, Field(min_length=8, max_length=64, pattern=PEER_ID_PATTERN)]
"""A libp2p peer id in base58 (``12D3KooW…`` or ``Qm…``)."""


def short_peer_id(peer_id: str) -> str:
    """How people read a peer id (status, the live screen, the web page, logs): ``…`` and its last 6 characters;
    a name of 8 characters or fewer (a test's or the simulator's) as it is."""
    return "…" + peer_id[-6:] if len(peer_id) > 8 else peer_id
