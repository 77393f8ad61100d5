"""Byte framing on hivemind's raw binary streams (the bulk path: tensors and state downloads).

A frame is a 4-byte big-endian length and that many bytes (a JSON header or reply); bulk data
follows a header as exactly the number of raw bytes the header announces. Every read has a
deadline (None: the caller's own) and a size cap; a stream that ends early raises ``StreamClosed``.
"""

from __future__ import annotations

import asyncio
import contextlib

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
