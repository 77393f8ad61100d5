"""The RPC server side: one hivemind ``ServicerBase`` that parses, validates and delegates.

Unary protobuf handlers: flow messages and ping. Bulk handlers on raw binary streams (see
``framing.py``; 2–3× faster than protobuf parts here, docs/transport.md): forward, backward and
fetch_state. Every request is parsed strictly, then handed to the daemon's ``TransportHandlers``;
this module contains no training logic. Errors go back as a typed ``Reply``, never a traceback.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Awaitable
from typing import Any, Protocol, TypeVar

import torch
from hivemind.p2p import P2P, P2PContext, ServicerBase
from hivemind.proto import runtime_pb2

from gwtfp2p.transport.codec import DTYPES, TensorAssembler, TensorHeader
from gwtfp2p.transport.compression import FLOAT_DTYPES, decode, wire_nbytes
from gwtfp2p.transport.errors import ProtocolError, RemoteErrorKind
from gwtfp2p.transport.framing import ByteSource, StreamSource, read_frame, wait_closed_by_peer, write_frame
from gwtfp2p.transport.limits import TransportLimits
from gwtfp2p.transport.messages import (
    MAX_META_BYTES,
    Ack,
    FetchRequest,
    PingInfo,
    Reply,
    StateBlob,
    StateHeader,
    TransferHeader,
    TransferMeta,
    parse_wire,
)
from gwtfp2p.transport.quotas import PeerQuotas

logger = logging.getLogger(__name__)
MAX_NONCE_BYTES = 8
HASH_IN_THREAD_BYTES = 2**20
LINGER_S = 10.0  # longest a server waits for the caller to close a finished stream
BULK_METHODS = ("bulk_forward", "bulk_backward", "bulk_fetch_state")
DECODE_IN_THREAD_VALUES = 1 << 16  # larger tensors are decoded off the event loop
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

    async def get_steps(self, stage: int, since_iteration: int) -> StateBlob | None:
        """The part's steps since ``since_iteration`` (for a joiner that fell behind), as opaque bytes."""
        ...


class _Failed(Exception):
    def __init__(self, kind: RemoteErrorKind, message: str):
        super().__init__(message)
        self.kind = kind


def reply_message(reply: Reply) -> runtime_pb2.ExpertResponse:
    return runtime_pb2.ExpertResponse(metadata=reply.model_dump_json().encode())


async def sha256_hex(data: bytes | memoryview) -> str:
    """sha256 of ``data``; large inputs are hashed in a worker thread (hashlib releases the GIL)."""
    if len(data) <= HASH_IN_THREAD_BYTES:
        return hashlib.sha256(data).hexdigest()
    return await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())


def wire_assembler(header: TransferHeader, max_bytes: int, sender: str) -> TensorAssembler:
    """Where a transfer's bytes go: the tensor itself (``none``) or its encoded payload (a lossy codec)."""
    codec = header.meta.codec
    if codec == "none":
        return TensorAssembler(header.tensor, max_bytes, sender)
    dtype = DTYPES[header.tensor.dtype]
    if dtype not in FLOAT_DTYPES:
        raise ProtocolError(f"the {codec} codec carries float tensors, not {header.tensor.dtype}", sender)
    if header.tensor.nbytes > max_bytes:
        raise ProtocolError(f"tensor of {header.tensor.nbytes} bytes exceeds the {max_bytes} byte limit", sender)
    size = wire_nbytes(codec, dtype, math.prod(header.tensor.shape))
    return TensorAssembler(TensorHeader(dtype="uint8", shape=(size,)), max_bytes, sender)


async def decoded(header: TransferHeader, received: torch.Tensor, sender: str) -> torch.Tensor:
    """The tensor a transfer stands for, from what ``wire_assembler`` collected."""
    codec = header.meta.codec
    if codec == "none":
        return received
    args = (received, codec, DTYPES[header.tensor.dtype], header.tensor.shape)
    try:
        if received.numel() <= DECODE_IN_THREAD_VALUES:
            return decode(*args)
        return await asyncio.to_thread(decode, *args)
    except ValueError as e:
        raise ProtocolError(f"bad {codec} payload: {e}", sender) from e


class TransportServicer(ServicerBase):
    """Serves one node's RPCs; register with ``await servicer.add_p2p_handlers(p2p, namespace=...)``."""

    def __init__(self, handlers: TransportHandlers, limits: TransportLimits):
        self.handlers = handlers
        self.limits = limits
        self._inflight = 0
        self.quotas = PeerQuotas(limits.max_streams_per_peer, limits.max_peer_bytes)

    @classmethod
    def bulk_name(cls, namespace: str | None, method: str) -> str:
        return cls._get_handle_name(namespace, method)

    async def add_p2p_handlers(self, p2p: P2P, wrapper: Any = None, *, namespace: str | None = None,
                               balanced: bool = False) -> None:
        await super().add_p2p_handlers(p2p, wrapper, namespace=namespace, balanced=balanced)
        for method in BULK_METHODS:
            await p2p.add_binary_stream_handler(self.bulk_name(namespace, method), getattr(self, method), balanced)

    async def remove_p2p_handlers(self, p2p: P2P, *, namespace: str | None = None) -> None:
        await super().remove_p2p_handlers(p2p, namespace=namespace)
        for method in BULK_METHODS:
            await p2p.remove_binary_stream_handler(self.bulk_name(namespace, method))

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

    async def _guarded(self, what: str, work: Awaitable[Reply]) -> Reply:
        try:
            return await work
        except ProtocolError as e:
            logger.debug("bad %s request from %s: %s", what, e.peer_id, e)
            return Reply.error("bad_request", str(e))
        except _Failed as e:
            return Reply.error(e.kind, str(e))

    # ----- forward / backward (bulk) -----

    async def _receive_transfer(self, kind: str, sender: str, source: ByteSource) -> Reply:
        timeout_s = self.limits.part_timeout_s
        raw = await source.frame(MAX_META_BYTES, self.limits.header_timeout_s, sender)
        header = parse_wire(TransferHeader, raw, sender)
        size = header.tensor.nbytes
        if not self.quotas.take_bytes(sender, size):
            raise _Failed("busy", f"over this peer's {self.limits.max_peer_bytes} tensor bytes in memory")
        try:
            assembler = wire_assembler(header, self.limits.max_tensor_bytes, sender)
            while not assembler.complete:
                view = assembler.next_view(source.max_read)
                await source.read_into(view, timeout_s)
                assembler.advance(len(view))
            tensor = await decoded(header, assembler.tensor(), sender)
            handler = self.handlers.on_forward if kind == "forward" else self.handlers.on_backward
            ack = await self._call(kind, handler(sender, header.meta, tensor))
        finally:
            self.quotas.give_bytes(sender, size)
        if not isinstance(ack, Ack):
            raise _Failed("internal", f"{kind} handler returned {type(ack).__name__}, not Ack")
        return Reply(ack=ack)

    async def _serve_bulk(self, what: str, info: Any, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        sender = info.peer_id.to_base58()
        try:
            await self._serve_counted(what, sender, reader, writer)
            await wait_closed_by_peer(reader, min(self.limits.part_timeout_s, LINGER_S))
        except (ConnectionError, asyncio.TimeoutError) as e:
            logger.debug("%s stream from %s ended early: %r", what, sender, e)
        except Exception:
            logger.exception("%s stream from %s failed", what, sender)
        finally:
            writer.close()

    async def _serve_counted(self, what: str, sender: str, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        """Serve one bulk request; at most ``max_inflight_streams`` at once (lingering not counted)."""
        if what != "fetch_state":
            await self._reply(writer, await self.transfer_reply(what, sender,
                                                                StreamSource(reader, self.limits.part_bytes)))
            return
        if not self.quotas.take_stream(sender):
            await self._reply(writer, Reply.error("busy", "over this peer's share of bulk streams"))
            return
        self._inflight += 1
        try:
            if self._inflight > self.limits.max_inflight_streams:
                limit = self.limits.max_inflight_streams
                await self._reply(writer, Reply.error("busy", f"over {limit} bulk streams in flight"))
            else:
                await self._send_state(sender, reader, writer)
        finally:
            self._inflight -= 1
            self.quotas.give_stream(sender)

    async def transfer_reply(self, kind: str, sender: str, source: ByteSource) -> Reply:
        """Receive one forward or backward from ``source``, hand it to the handler: the reply to send.
        At most ``max_inflight_streams`` bulk requests at once (libp2p streams and direct ones together);
        an error reply may come before the tensor was read. One peer holds at most its share (``quotas``)."""
        if not self.quotas.take_stream(sender):
            return Reply.error("busy", f"over this peer's {self.limits.max_streams_per_peer} bulk streams in flight")
        self._inflight += 1
        try:
            if self._inflight > self.limits.max_inflight_streams:
                return Reply.error("busy", f"over {self.limits.max_inflight_streams} bulk streams in flight")
            return await self._guarded(kind, self._receive_transfer(kind, sender, source))
        finally:
            self._inflight -= 1
            self.quotas.give_stream(sender)

    async def _reply(self, writer: asyncio.StreamWriter, reply: Reply) -> None:
        await asyncio.wait_for(write_frame(writer, reply.model_dump_json().encode()), self.limits.part_timeout_s)

    async def bulk_forward(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve_bulk("forward", info, reader, writer)

    async def bulk_backward(self, info: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._serve_bulk("backward", info, reader, writer)

    async def bulk_fetch_state(self, info: Any, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter) -> None:
        await self._serve_bulk("fetch_state", info, reader, writer)

    # ----- state download (bulk) -----

    async def _state_header(self, sender: str, reader: asyncio.StreamReader) -> tuple[Reply, memoryview]:
        raw = await read_frame(reader, MAX_META_BYTES, self.limits.part_timeout_s, sender)
        fetch = parse_wire(FetchRequest, raw, sender)
        if fetch.since_iteration is None:
            blob = await self._call("get_state", self.handlers.get_state(fetch.stage))
        else:
            blob = await self._call("get_steps", self.handlers.get_steps(fetch.stage, fetch.since_iteration))
        if blob is None:
            raise _Failed("unavailable", f"no state for stage {fetch.stage} here")
        if not isinstance(blob, StateBlob) or not isinstance(blob.data, (bytes, bytearray)):
            raise _Failed("internal", "get_state returned something other than StateBlob(bytes)")
        header = StateHeader(stage=blob.stage, iteration=blob.iteration, size_bytes=len(blob.data),
                             sha256=await sha256_hex(blob.data))
        return Reply(state=header), memoryview(blob.data)

    async def _send_state(self, sender: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        view = memoryview(b"")

        async def header() -> Reply:
            nonlocal view
            reply, view = await self._state_header(sender, reader)
            return reply

        await self._reply(writer, await self._guarded("fetch_state", header()))
        timeout_s = self.limits.part_timeout_s
        for start in range(0, len(view), self.limits.part_bytes):
            writer.write(view[start:start + self.limits.part_bytes])
            await asyncio.wait_for(writer.drain(), timeout_s)

    # ----- flow messages and ping (unary protobuf) -----

    async def _receive_flow(self, payload: bytes, sender: str) -> Reply:
        if len(payload) > self.limits.max_flow_payload_bytes:
            raise ProtocolError(f"flow message of {len(payload)} bytes exceeds "
                                f"{self.limits.max_flow_payload_bytes}", sender)
        await self._call("flow", self.handlers.on_flow_message(sender, payload))
        return Reply()

    async def rpc_flow(self, request: runtime_pb2.ExpertRequest,
                       context: P2PContext) -> runtime_pb2.ExpertResponse:
        sender = context.remote_id.to_base58()
        return reply_message(await self._guarded("flow", self._receive_flow(bytes(request.metadata), sender)))

    async def rpc_ping(self, request: runtime_pb2.ExpertRequest,
                       context: P2PContext) -> runtime_pb2.ExpertResponse:
        if len(request.metadata) > MAX_NONCE_BYTES:
            return reply_message(Reply.error("bad_request", "ping nonce longer than 8 bytes"))
        nonce = int.from_bytes(request.metadata, "big") & (2**63 - 1)
        return reply_message(Reply(ping=PingInfo(nonce=nonce, peer_time=time.time())))
