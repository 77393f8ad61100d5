"""Byte framing on the bulk path: hivemind's raw binary streams and the direct channel's TCP sockets.

A frame is a 4-byte big-endian length and that many bytes (a JSON header or reply); bulk data
follows a header as exactly the number of raw bytes the header announces. Every read has a
deadline (None: the caller's own) and a size cap; a stream that ends early raises ``StreamClosed``.
A ``ByteSource`` reads frames and fills memory in place: ``StreamSource`` from a libp2p stream (one
copy out of asyncio's buffer), ``SocketSource`` from a non-blocking socket (the kernel writes straight
into the destination).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Protocol

from gwtfp2p.transport.errors import ProtocolError

FRAME_PREFIX_BYTES = 4


class StreamClosed(ConnectionError):
    """The other side closed (or reset) the stream before sending what was expected."""


async def _read_exactly(reader: asyncio.StreamReader, size: int, timeout_s: float | None) -> bytes:
    try:
        return await asyncio.wait_for(reader.readexactly(size), timeout_s)
    except asyncio.IncompleteReadError as e:
        raise StreamClosed(f"stream closed after {len(e.partial)} of {size} bytes") from None


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(FRAME_PREFIX_BYTES, "big") + payload


async def write_frame(writer: asyncio.StreamWriter, payload: bytes) -> None:
    writer.write(frame(payload))
    await writer.drain()


async def read_frame(reader: asyncio.StreamReader, max_bytes: int, timeout_s: float | None,
                     peer_id: str = "") -> bytes:
    """Read one frame; ``ProtocolError`` if it announces more than ``max_bytes``."""
    size = int.from_bytes(await _read_exactly(reader, FRAME_PREFIX_BYTES, timeout_s), "big")
    if size > max_bytes:
        raise ProtocolError(f"frame of {size} bytes exceeds {max_bytes}", peer_id)
    return await _read_exactly(reader, size, timeout_s)


async def read_chunk(reader: asyncio.StreamReader, size: int, timeout_s: float | None) -> bytes:
    """Read exactly ``size`` raw bytes (one part of bulk data)."""
    return await _read_exactly(reader, size, timeout_s)


async def _discard_until_eof(reader: asyncio.StreamReader) -> None:
    while await reader.read(2**16):
        pass


async def wait_closed_by_peer(reader: asyncio.StreamReader, timeout_s: float) -> None:
    """Linger until the other side closes the stream (or ``timeout_s`` passes), discarding input.

    The side that has sent its last bytes must not close first: its p2pd may reset the stream
    before those bytes are forwarded, and the other side then loses them.
    """
    with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
        await asyncio.wait_for(_discard_until_eof(reader), timeout_s)


class ByteSource(Protocol):
    """Where a request's frames and bulk bytes come from; ``max_read``: the most bytes one read fills."""

    max_read: int

    async def frame(self, max_bytes: int, timeout_s: float | None, peer_id: str = "") -> bytes: ...

    async def read_into(self, view: memoryview, timeout_s: float | None) -> None: ...


class StreamSource:
    """A libp2p stream (``asyncio.StreamReader``), read in parts of ``part_bytes``."""

    def __init__(self, reader: asyncio.StreamReader, part_bytes: int) -> None:
        self.reader = reader
        self.max_read = part_bytes

    async def frame(self, max_bytes: int, timeout_s: float | None, peer_id: str = "") -> bytes:
        return await read_frame(self.reader, max_bytes, timeout_s, peer_id)

    async def read_into(self, view: memoryview, timeout_s: float | None) -> None:
        view[:] = await _read_exactly(self.reader, len(view), timeout_s)


class SocketSource:
    """A connected non-blocking TCP socket, read on the running event loop with no intermediate copy."""

    max_read = 1 << 62

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    async def read_into(self, view: memoryview, timeout_s: float | None) -> None:
        loop, done = asyncio.get_running_loop(), 0
        while done < len(view):
            n = await asyncio.wait_for(loop.sock_recv_into(self.sock, view[done:]), timeout_s)
            if n == 0:
                raise StreamClosed(f"connection closed after {done} of {len(view)} bytes")
            done += n

    async def frame(self, max_bytes: int, timeout_s: float | None, peer_id: str = "") -> bytes:
        prefix = bytearray(FRAME_PREFIX_BYTES)
        await self.read_into(memoryview(prefix), timeout_s)
        size = int.from_bytes(prefix, "big")
        if size > max_bytes:
            raise ProtocolError(f"frame of {size} bytes exceeds {max_bytes}", peer_id)
        body = bytearray(size)
        await self.read_into(memoryview(body), timeout_s)
        return bytes(body)
