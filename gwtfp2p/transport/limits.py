"""Limits and tunables of the transport (sizes, server-side deadlines), validated once.

Client-side deadlines are per call (``timeout_s``); these are the server's own guards against
slow or hostile peers, and the sizes both sides agree on.
"""

from __future__ import annotations

from dataclasses import dataclass

from gwtfp2p.config import require, require_positive
from gwtfp2p.transport.codec import DEFAULT_PART_BYTES

UNARY_LIMIT_BYTES = 4 * 2**20  # hivemind's unary message cap


@dataclass(frozen=True)
class TransportLimits:
    part_bytes: int = DEFAULT_PART_BYTES  # bytes per write/read of a tensor or state stream
    max_tensor_bytes: int = 2**30  # largest activation/gradient a server accepts
    max_state_bytes: int = 64 * 2**30  # largest state a client downloads
    max_flow_payload_bytes: int = 256 * 2**10  # flow-protocol messages are small
    max_inflight_streams: int = 64  # bulk streams served at once, over all peers
    max_streams_per_peer: int = 16  # ... of which one peer may hold this many (quotas.py)
    max_peer_bytes: int = 2 * 2**30  # tensor bytes one peer may have in a server's memory at once
    header_timeout_s: float = 5.0  # a bulk stream must send its header within this (idle streams are dropped)
    handler_timeout_s: float = 10.0  # a TransportHandlers callback must answer within this
    part_timeout_s: float = 30.0  # a server drops a stream idle for this long
    namespace: str = "gwtf"  # RPC handler namespace (peers of other namespaces cannot call us)
    direct_channel: bool = True  # forwards/backwards over direct TCP beside libp2p where it connects (direct.py)

    def __post_init__(self) -> None:
        require(isinstance(self.part_bytes, int) and 4096 <= self.part_bytes <= 64 * 2**20,
                "--rpc-part-bytes", "must be an integer in [4096, 64 MiB]")
        require(self.max_tensor_bytes >= 1 and self.max_state_bytes >= 1, "--rpc-max-bytes", "must be >= 1")
        require(1 <= self.max_flow_payload_bytes <= UNARY_LIMIT_BYTES - 4096, "--rpc-max-flow-bytes",
                f"must be within [1, {UNARY_LIMIT_BYTES - 4096}] (hivemind's unary cap is 4 MiB)")
        require(isinstance(self.max_inflight_streams, int) and self.max_inflight_streams >= 1,
                "--rpc-max-inflight-streams", "must be an integer >= 1")
        require(isinstance(self.max_streams_per_peer, int) and 1 <= self.max_streams_per_peer
                <= self.max_inflight_streams, "--rpc-max-streams-per-peer", "must be within 1..max_inflight_streams")
        require(self.max_peer_bytes >= self.max_tensor_bytes, "--rpc-max-peer-bytes", "must be >= max_tensor_bytes")
        require_positive(self.header_timeout_s, "--rpc-header-timeout-s")
        require_positive(self.handler_timeout_s, "--rpc-handler-timeout-s")
        require_positive(self.part_timeout_s, "--rpc-part-timeout-s")
        require(bool(self.namespace) and self.namespace.isascii(), "--rpc-namespace",
                "must be non-empty ASCII")
