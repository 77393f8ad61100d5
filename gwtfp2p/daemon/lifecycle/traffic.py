"""What arrives at this node, counted where every RPC comes in: a pass-through in front of the inbox.

``CountedHandlers`` is the transport's ``TransportHandlers``: it counts each call (the wire bytes of
forwards, backwards and aggregation contributions, in the codec they travelled in, as the sender
counts them; flow and control payload bytes; the states and step logs it hands out to joiners) and
passes it on to the inbox unchanged. The counts are plain numbers for the metrics; nothing here
decides anything or looks inside a payload.
"""

from __future__ import annotations

from collections import Counter

import torch

from gwtfp2p.daemon.wire import is_aggregation
from gwtfp2p.transport import Ack, StateBlob, TransferMeta, TransportHandlers
from gwtfp2p.transport.compression import wire_nbytes

RECEIVED_KINDS = ("forward", "backward", "aggregation", "message")
SERVED_KINDS = ("state", "steps")


def wire_bytes(meta: TransferMeta, tensor: torch.Tensor) -> int:
    """What ``tensor`` (decoded by the transport) took on the wire in ``meta.codec``."""
    try:
        return wire_nbytes(meta.codec, tensor.dtype, tensor.numel())
    except ValueError:  # not a codec of this version (the transport refuses those): its raw size
        return tensor.numel() * tensor.element_size()


class CountedHandlers:
    """``handlers`` (the node's inbox) with what reached them counted: ``received_bytes`` and
    ``received`` by kind (``RECEIVED_KINDS``), ``served_bytes`` and ``served`` by kind (``SERVED_KINDS``)."""

    def __init__(self, handlers: TransportHandlers) -> None:
        self._handlers = handlers
        self.received_bytes: Counter[str] = Counter()
        self.received: Counter[str] = Counter()
        self.served_bytes: Counter[str] = Counter()
        self.served: Counter[str] = Counter()

    def _arrived(self, kind: str, size_bytes: int) -> None:
        self.received[kind] += 1
        self.received_bytes[kind] += size_bytes

    def _served(self, kind: str, blob: StateBlob | None) -> StateBlob | None:
        if blob is not None:
            self.served[kind] += 1
            self.served_bytes[kind] += len(blob.data)
        return blob

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        self._arrived("aggregation" if is_aggregation(meta) else "forward", wire_bytes(meta, tensor))
        return await self._handlers.on_forward(sender, meta, tensor)

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        self._arrived("backward", wire_bytes(meta, tensor))
        return await self._handlers.on_backward(sender, meta, tensor)

    async def on_flow_message(self, sender: str, payload: bytes) -> None:
        self._arrived("message", len(payload))
        await self._handlers.on_flow_message(sender, payload)

    async def get_state(self, stage: int) -> StateBlob | None:
        return self._served("state", await self._handlers.get_state(stage))

    async def get_steps(self, stage: int, since_iteration: int) -> StateBlob | None:
        return self._served("steps", await self._handlers.get_steps(stage, since_iteration))
