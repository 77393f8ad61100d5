"""The RPC server side: one hivemind ``ServicerBase`` whose handlers parse, validate and delegate.

Handlers: forward and backward (client-streamed tensor parts, unary reply), flow (unary small
payload), ping (unary) and fetch_state (server-streamed state download). Every request is parsed
strictly, then handed to the daemon's ``TransportHandlers`` callbacks; this module contains no
training logic. Errors go back to the caller as a typed ``Reply`` (no tracebacks across the wire).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable
from typing import AsyncIterator, Protocol, TypeVar  # noqa: UP035 - hivemind inspects typing.AsyncIterator

import torch
from hivemind.p2p import P2PContext, ServicerBase
from hivemind.proto import runtime_pb2

from gwtfp2p.transport.codec import TensorAssembler
from gwtfp2p.transport.errors import ProtocolError, RemoteErrorKind
from gwtfp2p.transport.limits import TransportLimits
from gwtfp2p.transport.messages import (
    Ack,
    FetchRequest,
    PingInfo,
    Reply,
    StateBlob,
    StateHeader,
    TransferMeta,
    parse_wire,
)

logger = logging.getLogger(__name__)
MAX_NONCE_BYTES = 8
HASH_IN_THREAD_BYTES = 2**20
LINGER_S = 10.0  # longest a server keeps a finished stream open for the caller to close it
T = TypeVar("T")


class TransportHandlers(Protocol):
    """What the daemon supplies; every callback must answer quickly (``limits.handler_timeout_s``).

    ``sender`` is the caller's peer id as authenticated by libp2p. ``on_forward``/``on_backward``
    acknowledge receipt (enqueue the work, do not compute inside); they get a CPU tensor.
    """

    async def on_forward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack: ...

    async def on_backward(self, sender: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack: ...

    async def on_flow_message(self, sender: str, payload: bytes) -> None: ...

    async def get_state(self, stage: int) -> StateBlob | None: ...


class _Failed(Exception):
    def __init__(self, kind: RemoteErrorKind, message: str):
        super().__init__(message)
        self.kind = kind


def reply_message(reply: Reply) -> runtime_pb2.ExpertResponse:
    return runtime_pb2.ExpertResponse(metadata=reply.model_dump_json().encode())


async def sha256_hex(data: bytes) -> str:
    """sha256 of ``data``; large inputs are hashed in a worker thread (hashlib releases the GIL)."""
    if len(data) <= HASH_IN_THREAD_BYTES:
        return hashlib.sha256(data).hexdigest()
    return await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())


class TransportServicer(ServicerBase):
    """Serves one node's RPCs; register with ``await servicer.add_p2p_handlers(p2p, namespace=...)``."""

    def __init__(self, handlers: TransportHandlers, limits: TransportLimits):
        self.handlers = handlers
        self.limits = limits

    async def _call(self, what: str, awaitable: Awaitable[T]) -> T:
        try:
            return await asyncio.wait_for(awaitable, self.limits.handler_timeout_s)
        except asyncio.TimeoutError:
            deadline_s = self.limits.handler_timeout_s
            raise _Failed("busy", f"{what} handler missed its {deadline_s:.1f} s deadline") from None
        except (ProtocolError, _Failed):
            raise
        except Exception as e:
            logger.exception("%s handler failed", what)
            raise _Failed("internal", f"{what} handler failed: {type(e).__name__}") from e

    async def _guarded(self, what: str, work: Awaitable[Reply]) -> runtime_pb2.ExpertResponse:
        try:
            reply = await work
        except ProtocolError as e:
            logger.debug("bad %s request from %s: %s", what, e.peer_id, e)
            reply = Reply.error("bad_request", str(e))
        except _Failed as e:
            reply = Reply.error(e.kind, str(e))
        return reply_message(reply)

    # ----- forward / backward -----

    async def _next_part(self, requests: AsyncIterator[runtime_pb2.ExpertRequest],
                         sender: str) -> runtime_pb2.ExpertRequest | None:
        try:
            return await asyncio.wait_for(requests.__anext__(), self.limits.part_timeout_s)
        except StopAsyncIteration:
            return None
        except asyncio.TimeoutError:
            raise ProtocolError(f"no part for {self.limits.part_timeout_s:.0f} s", sender) from None

    async def _receive_transfer(self, kind: str, requests: AsyncIterator[runtime_pb2.ExpertRequest],
                                sender: str) -> Reply:
        request = await self._next_part(requests, sender)
        if request is None:
            raise ProtocolError("empty request stream", sender)
        meta = parse_wire(TransferMeta, request.metadata, sender)
        assembler = TensorAssembler(self.limits.max_tensor_bytes, sender)
        while True:
            if len(request.tensors) != 1:
                raise ProtocolError(f"a part must carry one tensor part, got {len(request.tensors)}", sender)
            if assembler.add(request.tensors[0]):
                break
            request = await self._next_part(requests, sender)
            if request is None:
                raise ProtocolError("the stream ended before the tensor was complete", sender)
            if request.metadata:
                raise ProtocolError("metadata is allowed only in the first part", sender)
        # Wait for the caller's end-of-stream before replying: closing a stream the caller is still
        # writing to resets it, and the reply can be lost (seen as "Broken pipe" by the caller).
        if await self._next_part(requests, sender) is not None:
            raise ProtocolError("parts after the tensor was complete", sender)
        handler = self.handlers.on_forward if kind == "forward" else self.handlers.on_backward
        ack = await self._call(kind, handler(sender, meta, assembler.tensor()))
        if not isinstance(ack, Ack):
            raise _Failed("internal", f"{kind} handler returned {type(ack).__name__}, not Ack")
        return Reply(ack=ack)

    async def _linger(self) -> None:
        """Keep a finished stream open until the caller closes it (hivemind then cancels us).

        If the server side closes first, its p2pd may reset the stream before the last bytes
        written are forwarded, and the caller loses the reply (seen as "closed without a reply").
        """
        await asyncio.sleep(min(self.limits.part_timeout_s, LINGER_S))

    async def rpc_forward(self, requests: AsyncIterator[runtime_pb2.ExpertRequest],
                          context: P2PContext) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        sender = context.remote_id.to_base58()
        yield await self._guarded("forward", self._receive_transfer("forward", requests, sender))
        await self._linger()

    async def rpc_backward(self, requests: AsyncIterator[runtime_pb2.ExpertRequest],
                           context: P2PContext) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        sender = context.remote_id.to_base58()
        yield await self._guarded("backward", self._receive_transfer("backward", requests, sender))
        await self._linger()

    # ----- flow messages and ping -----

    async def _receive_flow(self, payload: bytes, sender: str) -> Reply:
        if len(payload) > self.limits.max_flow_payload_bytes:
            raise ProtocolError(f"flow message of {len(payload)} bytes exceeds "
                                f"{self.limits.max_flow_payload_bytes}", sender)
        await self._call("flow", self.handlers.on_flow_message(sender, payload))
        return Reply()

    async def rpc_flow(self, request: runtime_pb2.ExpertRequest,
                       context: P2PContext) -> runtime_pb2.ExpertResponse:
        sender = context.remote_id.to_base58()
        return await self._guarded("flow", self._receive_flow(bytes(request.metadata), sender))

    async def rpc_ping(self, request: runtime_pb2.ExpertRequest,
                       context: P2PContext) -> runtime_pb2.ExpertResponse:
        if len(request.metadata) > MAX_NONCE_BYTES:
            return reply_message(Reply.error("bad_request", "ping nonce longer than 8 bytes"))
        nonce = int.from_bytes(request.metadata, "big") & (2**63 - 1)
        return reply_message(Reply(ping=PingInfo(nonce=nonce, peer_time=time.time())))

    # ----- state download -----

    async def _state_header(self, request: runtime_pb2.ExpertRequest,
                            sender: str) -> tuple[Reply, memoryview]:
        fetch = parse_wire(FetchRequest, request.metadata, sender)
        blob = await self._call("get_state", self.handlers.get_state(fetch.stage))
        if blob is None:
            raise _Failed("unavailable", f"no state for stage {fetch.stage} here")
        if not isinstance(blob, StateBlob) or not isinstance(blob.data, (bytes, bytearray)):
            raise _Failed("internal", "get_state returned something other than StateBlob(bytes)")
        header = StateHeader(stage=blob.stage, iteration=blob.iteration, size_bytes=len(blob.data),
                             sha256=await sha256_hex(blob.data))
        return Reply(state=header), memoryview(blob.data)

    async def rpc_fetch_state(self, request: runtime_pb2.ExpertRequest,
                              context: P2PContext) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        sender = context.remote_id.to_base58()
        view = memoryview(b"")

        async def header() -> Reply:
            nonlocal view
            reply, view = await self._state_header(request, sender)
            return reply

        yield await self._guarded("fetch_state", header())
        for start in range(0, len(view), self.limits.part_bytes):
            yield runtime_pb2.ExpertResponse(metadata=view[start:start + self.limits.part_bytes].tobytes())
        await self._linger()
