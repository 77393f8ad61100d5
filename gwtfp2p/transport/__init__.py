"""gwtfp2p.transport: tensor codec, RPC servicer + client over hivemind P2P, link emulation (docs/architecture.md).

Start with ``Transport.start(p2p, handlers)`` (or ``Transport.standalone``); see docs/transport.md.
Importing this package imports hivemind (≈3 s, mostly torch).
"""

from gwtfp2p.transport.codec import DEFAULT_PART_BYTES, TensorAssembler, TensorHeader, iter_chunks, tensor_header
from gwtfp2p.transport.errors import (
    REMOTE_ERROR_KINDS,
    PeerTimeout,
    PeerUnreachable,
    ProtocolError,
    RemoteError,
    TransportError,
)
from gwtfp2p.transport.limits import TransportLimits
from gwtfp2p.transport.link_emulation import LinkEmulator, canonical_location
from gwtfp2p.transport.messages import (
    Ack,
    FetchedState,
    MicrobatchId,
    PingResult,
    StateBlob,
    TransferMeta,
)
from gwtfp2p.transport.rpc import Transport
from gwtfp2p.transport.servicer import TransportHandlers

__all__ = [
    "DEFAULT_PART_BYTES",
    "REMOTE_ERROR_KINDS",
    "Ack",
    "FetchedState",
    "LinkEmulator",
    "MicrobatchId",
    "PeerTimeout",
    "PeerUnreachable",
    "PingResult",
    "ProtocolError",
    "RemoteError",
    "StateBlob",
    "TensorAssembler",
    "TensorHeader",
    "TransferMeta",
    "Transport",
    "TransportError",
    "TransportHandlers",
    "TransportLimits",
    "canonical_location",
    "iter_chunks",
    "tensor_header",
]
