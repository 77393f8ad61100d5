"""The RPC client side: calls a peer's ``TransportServicer`` with a deadline and typed errors.

Every method takes ``timeout_s`` (the whole call, emulated link delay included) and raises only
``TransportError`` subclasses: ``PeerUnreachable``, ``PeerTimeout``, ``RemoteError``,
``ProtocolError``. Link emulation, when configured, delays requests before they leave and replies
after they arrive (both directions emulated by the caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import torch
from hivemind.p2p import P2P, P2PDaemonError, P2PHandlerError, PeerID
from hivemind.proto import runtime_pb2

from gwtfp2p.transport.codec import iter_chunks, raw_bytes, tensor_header, tensor_nbytes
from gwtfp2p.transport.compression import encode
from gwtfp2p.transport.control_link import ControlLinkReset
from gwtfp2p.transport.direct import DirectClient, DirectFailed, exchange
from gwtfp2p.transport.direct import handler_name as direct_handler
from gwtfp2p.transport.errors import (
    PeerTimeout,
    PeerUnreachable,
    ProtocolError,
    RemoteError,
    TransportError,
    dial_error,
)
from gwtfp2p.transport.framing import StreamClosed, frame, read_chunk, read_frame
from gwtfp2p.transport.limits import TransportLimits
from gwtfp2p.transport.link_emulation import LinkEmulator
from gwtfp2p.transport.messages import (
    MAX_META_BYTES,
    Ack,
    DirectTicket,
    FetchedState,
    FetchRequest,
    PingResult,
    Reply,
    TransferHeader,
    TransferMeta,
    parse_wire,
)
from gwtfp2p.transport.servicer import TransportServicer, sha256_hex

T = TypeVar("T")
ENCODE_IN_THREAD_VALUES = 1 << 16  # larger tensors are encoded off the event loop (torch releases the GIL)
_UNREACHABLE_ERRORS = (P2PDaemonError, ConnectionError, asyncio.IncompleteReadError, EOFError, OSError)


def _check_reply(raw: bytes, peer_id: str) -> Reply:
    reply = parse_wire(Reply, raw, peer_id)
    if not reply.ok:
        kind = reply.kind or "internal"
        raise RemoteError(f"{peer_id} answered {kind}: {reply.message}", peer_id, kind)
    return reply


def _consume_result(call: asyncio.Future) -> None:
    """A call whose caller stopped waiting: its outcome is nobody's, but must be retrieved."""
    if not call.cancelled():
        call.exception()


async def wire_payload(tensor: torch.Tensor, codec: str) -> torch.Tensor:
    """What goes on the wire for ``tensor``: itself (``none``) or its encoding under ``codec``."""
    if codec == "none":
        return tensor
    if tensor.numel() <= ENCODE_IN_THREAD_VALUES:
        return encode(tensor, codec)
    return await asyncio.to_thread(encode, tensor, codec)


class TransportClient:
    """Outgoing RPCs of one node over a hivemind ``P2P`` handle."""

    def __init__(self, p2p: P2P, limits: TransportLimits, link: LinkEmulator | None = None):
        self._p2p = p2p
        self.limits = limits
        self.link = link
        self.direct = DirectClient(self._ask_ticket, self._peer_ips) if limits.direct_channel else None

    def _peer(self, peer_id: str) -> PeerID:
        try:
            return PeerID.from_base58(peer_id)
        except Exception as e:  # base58/multihash decoders raise several types
            raise PeerUnreachable(f"{peer_id!r} is not a valid peer id", peer_id) from e

    def _name(self, method: str) -> str:
        return TransportServicer._get_handle_name(self.limits.namespace, method)

    async def _delay(self, peer_id: str, size_bytes: int, include_latency: bool = True) -> None:
        if self.link is not None:
            await self.link.delay(peer_id, size_bytes, include_latency)

    async def _deadline(self, what: str, peer_id: str, timeout_s: float, work: Callable[[], Awaitable[T]]) -> T:
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be a positive finite number, got {timeout_s!r}")
        try:
            return await asyncio.wait_for(work(), timeout_s)
        except asyncio.TimeoutError:
            raise PeerTimeout(f"{what} to {peer_id}: no answer within {timeout_s:.2f} s", peer_id) from None
        except TransportError:
            raise
        except P2PHandlerError as e:
            raise RemoteError(f"{what} to {peer_id} failed remotely: {e}", peer_id, "internal") from e
        except _UNREACHABLE_ERRORS as e:
            raise PeerUnreachable(f"{what} to {peer_id}: {dial_error(e)}", peer_id) from e

    @contextlib.asynccontextmanager
    async def _bulk_stream(self, peer_id: str, method: str):
        """A raw stream to ``peer_id``'s bulk handler, closed on exit (the server lingers until then)."""
        _, reader, writer = await self._p2p.call_binary_stream_handler(self._peer(peer_id), self._name(method))
        try:
            yield reader, writer
        finally:
            writer.close()

    # ----- forward / backward -----

    async def _send_tensor(self, writer: asyncio.StreamWriter, peer_id: str, header: bytes,
                           payload: torch.Tensor) -> None:
        await self._delay(peer_id, len(header))  # latency once, then bandwidth per part (pipelined)
        writer.write(frame(header))
        for chunk in iter_chunks(payload, self.limits.part_bytes):
            await self._delay(peer_id, len(chunk), include_latency=False)
            writer.write(chunk)
            await writer.drain()
        await writer.drain()

    async def _transfer(self, method: str, peer_id: str, meta: TransferMeta, tensor: torch.Tensor) -> Ack:
        if tensor_nbytes(tensor) > self.limits.max_tensor_bytes:
            raise ValueError(f"tensor of {tensor_nbytes(tensor)} bytes exceeds max_tensor_bytes")
        header = TransferHeader(meta=meta, tensor=tensor_header(tensor)).model_dump_json().encode()
        payload = await wire_payload(tensor, meta.codec)
        raw = await self._direct_transfer(method.removeprefix("bulk_"), peer_id, header, payload)
        if raw is not None:
            return await self._ack(method, peer_id, raw)
        async with self._bulk_stream(peer_id, method) as (reader, writer):
            # Read the reply while sending: a peer that refuses early answers before reading it all.
            sending = asyncio.create_task(self._send_tensor(writer, peer_id, header, payload))
            try:
                raw = await read_frame(reader, MAX_META_BYTES, None, peer_id)
            except StreamClosed as e:
                raise PeerUnreachable(f"{method} to {peer_id}: the stream closed without a reply", peer_id) from e
            finally:
                sending.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await sending
        return await self._ack(method, peer_id, raw)

    async def _ack(self, method: str, peer_id: str, raw: bytes) -> Ack:
        reply = _check_reply(raw, peer_id)
        await self._delay(peer_id, len(raw))
        if reply.ack is None:
            raise ProtocolError(f"{method} reply without an ack", peer_id)
        return reply.ack

    async def _direct_transfer(self, kind: str, peer_id: str, header: bytes, payload: torch.Tensor) -> bytes | None:
        """The transfer over a direct connection (``direct.py``): the raw reply, or None: use libp2p."""
        if self.direct is None:
            return None
        delay = (lambda size, latency: self._delay(peer_id, size, latency)) if self.link is not None else None
        with contextlib.suppress(DirectFailed):
            async with self.direct.connection(peer_id) as lease:
                if lease is None:
                    return None
                raw = await exchange(lease.sock, kind, header, raw_bytes(payload), delay, self.limits.part_bytes)
                lease.keep = parse_wire(Reply, raw, peer_id).ok  # an error reply ends the connection
                return raw
        return None

    async def _ask_ticket(self, peer_id: str) -> DirectTicket:
        try:
            response = await self._uncancelled_call(self._peer(peer_id), direct_handler(self.limits.namespace), b"")
        except (*_UNREACHABLE_ERRORS, P2PHandlerError) as e:  # the channel is then tried again later
            raise PeerUnreachable(f"no direct-channel ticket from {peer_id}: {e}", peer_id) from e
        ticket = _check_reply(response.metadata, peer_id).direct
        if ticket is None:
            raise ProtocolError("a direct-channel answer without a ticket", peer_id)
        return ticket

    async def _peer_ips(self, peer_id: str) -> list[str]:
        """The IP addresses our libp2p connections to ``peer_id`` use (none when relayed)."""
        peer = self._peer(peer_id)
        addrs = [str(a) for info in await self._p2p.list_peers() if info.peer_id == peer for a in info.addrs]
        return [m.split("/")[2] for m in addrs if m.split("/")[1:2] in (["ip4"], ["ip6"]) and "p2p-circuit" not in m]

    async def forward(self, peer_id: str, meta: TransferMeta, tensor: torch.Tensor, *, timeout_s: float) -> Ack:
        """Send activations for the next hop; returns the receiver's immediate ``Ack``."""
        return await self._deadline("forward", peer_id, timeout_s,
                                    lambda: self._transfer("bulk_forward", peer_id, meta, tensor))

    async def backward(self, peer_id: str, meta: TransferMeta, tensor: torch.Tensor, *, timeout_s: float) -> Ack:
        """Send gradients to the previous hop; returns the receiver's immediate ``Ack``."""
        return await self._deadline("backward", peer_id, timeout_s,
                                    lambda: self._transfer("bulk_backward", peer_id, meta, tensor))

    # ----- unary calls -----

    async def _unary(self, method: str, peer_id: str, metadata: bytes) -> Reply:
        peer = self._peer(peer_id)
        await self._delay(peer_id, len(metadata))
        try:
            response = await self._uncancelled_call(peer, self._name(method), metadata)
        except ControlLinkReset:  # lost with the old control connection (control_link.py): once more
            response = await self._uncancelled_call(peer, self._name(method), metadata)
        reply = _check_reply(response.metadata, peer_id)
        await self._delay(peer_id, len(response.metadata))
        return reply

    async def _uncancelled_call(self, peer: PeerID, name: str, metadata: bytes) -> runtime_pb2.ExpertResponse:
        """hivemind's unary call, never cancelled: hivemind's reader of the control connection dies
        (silently, for every call and handler of this node) when an answer comes for a call whose
        future was cancelled a moment before. A caller that stops waiting leaves the call to finish."""
        call = asyncio.ensure_future(self._p2p.call_protobuf_handler(
            peer, name, runtime_pb2.ExpertRequest(metadata=metadata), runtime_pb2.ExpertResponse))
        call.add_done_callback(_consume_result)
        return await asyncio.shield(call)

    async def send_flow(self, peer_id: str, payload: bytes, *, timeout_s: float) -> None:
        """Deliver one flow-protocol message; returns once the peer's handler has taken it."""
        if len(payload) > self.limits.max_flow_payload_bytes:
            raise ValueError(f"flow message of {len(payload)} bytes exceeds max_flow_payload_bytes")
        await self._deadline("flow message", peer_id, timeout_s,
                             lambda: self._unary("rpc_flow", peer_id, bytes(payload)))

    async def _ping(self, peer_id: str) -> PingResult:
        nonce = int.from_bytes(os.urandom(8), "big") & (2**63 - 1)
        started = time.monotonic()
        started_wall = time.time()
        reply = await self._unary("rpc_ping", peer_id, nonce.to_bytes(8, "big"))
        rtt_s = time.monotonic() - started
        if reply.ping is None or reply.ping.nonce != nonce:
            raise ProtocolError("ping reply without the nonce sent", peer_id)
        return PingResult(rtt_s=rtt_s, clock_offset_s=reply.ping.peer_time - (started_wall + rtt_s / 2))

    async def ping(self, peer_id: str, *, timeout_s: float) -> PingResult:
        """Measure the round trip time to a peer (and its clock offset)."""
        return await self._deadline("ping", peer_id, timeout_s, lambda: self._ping(peer_id))

    # ----- state download -----

    async def _fetch_state(self, peer_id: str, stage: int, max_bytes: int, since: int | None) -> FetchedState:
        request = FetchRequest(stage=stage, since_iteration=since).model_dump_json().encode()
        async with self._bulk_stream(peer_id, "bulk_fetch_state") as (reader, writer):
            await self._delay(peer_id, len(request))
            writer.write(frame(request))
            await writer.drain()
            raw = await read_frame(reader, MAX_META_BYTES, None, peer_id)
            header = _check_reply(raw, peer_id).state
            if header is None:
                raise ProtocolError("state reply without a header", peer_id)
            if header.size_bytes > max_bytes:
                raise ProtocolError(f"state of {header.size_bytes} bytes exceeds {max_bytes}", peer_id)
            await self._delay(peer_id, len(raw))
            data = bytearray()
            while len(data) < header.size_bytes:
                size = min(self.limits.part_bytes, header.size_bytes - len(data))
                chunk = await read_chunk(reader, size, None)
                data += chunk
                await self._delay(peer_id, len(chunk), include_latency=False)
        blob = bytes(data)
        del data
        digest = await sha256_hex(blob)
        if digest != header.sha256:
            raise ProtocolError(f"state from {peer_id} fails its sha256 check", peer_id)
        return FetchedState(stage=header.stage, iteration=header.iteration, data=blob, sha256=digest)

    async def fetch_state(self, peer_id: str, stage: int, *, timeout_s: float, max_bytes: int | None = None,
                          since_iteration: int | None = None) -> FetchedState:
        """Download a stage's weights + optimizer state from a replica (with ``since_iteration``: the
        steps it took since that iteration instead, for replay); size and sha256 are checked."""
        limit = self.limits.max_state_bytes if max_bytes is None else max_bytes
        return await self._deadline("fetch_state", peer_id, timeout_s,
                                    lambda: self._fetch_state(peer_id, stage, limit, since_iteration))
