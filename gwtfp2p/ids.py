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
