"""Tensor ↔ bytes: an exact, uncompressed encoding (a small validated header + the raw bytes).

The raw bytes are hivemind's ``CompressionType.NONE`` buffer layout (C-contiguous, little-endian;
bfloat16 as its 2 raw bytes, whatever ``USE_LEGACY_BFLOAT16`` says), cut into parts straight from
the tensor's memory. The receiver writes parts into one tensor preallocated from the untrusted,
validated header (dtype whitelist, rank, size cap): one copy, memory bounded. Errors on received
data raise ``ProtocolError``; misuse by a local caller raises ``ValueError``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from gwtfp2p.transport.errors import ProtocolError

DEFAULT_PART_BYTES = 2**20  # measured on loopback: see docs/transport.md
MAX_NDIM = 8
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
    "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
DTypeName = Literal["float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool"]


class TensorHeader(BaseModel):
    """What precedes a tensor's raw bytes on the wire."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    dtype: DTypeName
    shape: Annotated[tuple[Annotated[int, Field(ge=0, le=2**40)], ...], Field(max_length=MAX_NDIM)]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty(0, dtype=DTYPES[self.dtype]).element_size()


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _check_sendable(tensor: torch.Tensor) -> None:
    if tensor.device.type != "cpu":
        raise ValueError("move the tensor to CPU first (in the compute thread, not on the event loop)")
    if tensor.dtype not in _NAMES:
        raise ValueError(f"dtype {tensor.dtype} cannot be sent; supported: {', '.join(DTYPES)}")
    if tensor.dim() > MAX_NDIM:
        raise ValueError(f"tensor rank {tensor.dim()} exceeds {MAX_NDIM}")


def tensor_header(tensor: torch.Tensor) -> TensorHeader:
    _check_sendable(tensor)
    return TensorHeader(dtype=_NAMES[tensor.dtype], shape=tuple(tensor.shape))


def raw_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes as a flat memoryview (a copy only if the tensor is not contiguous)."""
    _check_sendable(tensor)
    flat = tensor.detach().contiguous().reshape(-1)
    array = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, dtype=np.uint8)
    return memoryview(array)


def iter_chunks(tensor: torch.Tensor, part_bytes: int = DEFAULT_PART_BYTES) -> Iterator[memoryview]:
    """Zero-copy views of ≤ ``part_bytes`` bytes covering the tensor (none for an empty tensor)."""
    if part_bytes < 1:
        raise ValueError(f"part_bytes must be >= 1, got {part_bytes}")
    raw = raw_bytes(tensor)
    for start in range(0, len(raw), part_bytes):
        yield raw[start:start + part_bytes]


class TensorAssembler:
    """Rebuilds one tensor from its header and byte chunks, validating the (untrusted) header."""

    def __init__(self, header: TensorHeader, max_bytes: int, peer_id: str = ""):
        self.peer_id = peer_id
        self.expected_bytes = header.nbytes
        if self.expected_bytes > max_bytes:
            raise ProtocolError(f"tensor of {self.expected_bytes} bytes exceeds the {max_bytes} byte limit", peer_id)
        self.received_bytes = 0
        self._out = torch.empty(header.shape, dtype=DTYPES[header.dtype])
        flat = self._out.reshape(-1)
        self._bytes = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, dtype=np.uint8)

    @property
    def remaining_bytes(self) -> int:
        return self.expected_bytes - self.received_bytes

    @property
    def complete(self) -> bool:
        return self.received_bytes == self.expected_bytes

    def next_view(self, max_bytes: int) -> memoryview:
        """The next ≤ ``max_bytes`` bytes of the tensor's memory, to be filled in place (then ``advance``)."""
        size = min(max_bytes, self.remaining_bytes)
        return memoryview(self._bytes[self.received_bytes:self.received_bytes + size]).cast("B")

    def advance(self, size: int) -> bool:
        """``size`` more bytes were written into ``next_view``'s memory; True once the tensor is complete."""
        if not 0 <= size <= self.remaining_bytes:
            raise ProtocolError(f"tensor data overruns its header ({self.received_bytes + size} > "
                                f"{self.expected_bytes} bytes)", self.peer_id)
        self.received_bytes += size
        return self.complete

    def add(self, chunk: bytes | bytearray | memoryview) -> bool:
        """Take the next chunk of raw bytes; returns True once the tensor is complete."""
        size = len(chunk)
        if size > self.remaining_bytes:
            raise ProtocolError(f"tensor data overruns its header ({self.received_bytes + size} > "
                                f"{self.expected_bytes} bytes)", self.peer_id)
        if size:
            self._bytes[self.received_bytes:self.received_bytes + size] = np.frombuffer(chunk, np.uint8)
            self.received_bytes += size
        return self.complete

    def tensor(self) -> torch.Tensor:
        """The rebuilt tensor; ``ProtocolError`` if bytes are missing."""
        if not self.complete:
            raise ProtocolError(f"tensor incomplete: {self.received_bytes} of {self.expected_bytes} bytes",
                                self.peer_id)
        return self._out


def decode(header: TensorHeader, chunks: list[bytes], max_bytes: int) -> torch.Tensor:
    """Rebuild a tensor from its header and all its chunks at once (tests and small tensors)."""
    assembler = TensorAssembler(header, max_bytes)
    for chunk in chunks:
        assembler.add(chunk)
    return assembler.tensor()
