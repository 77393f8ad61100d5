"""Tensor ↔ wire parts: exact (uncompressed) encoding into hivemind ``runtime_pb2.Tensor`` parts.

The wire format is hivemind's (``CompressionType.NONE``: raw little-endian bytes, header fields in
the first part, as ``split_for_streaming`` makes them), so hivemind's own serializer and this codec
interoperate. Differences: parts are cut straight from the tensor's memory, the receiver writes
them into one preallocated tensor (one copy, memory bounded by the validated header), and bfloat16
always travels as 2 bytes (exact, whatever ``USE_LEGACY_BFLOAT16`` says). Untrusted headers are
checked (dtype whitelist, rank, size cap, part sizes) and failures raise ``ProtocolError``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from hivemind.proto import runtime_pb2

from gwtfp2p.transport.errors import ProtocolError

DEFAULT_PART_BYTES = 2**20  # measured on loopback: see docs/transport.md
MAX_NDIM = 8
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
    "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _raw_bytes(tensor: torch.Tensor) -> np.ndarray:
    if tensor.device.type != "cpu":
        raise ValueError("move the tensor to CPU first (in the compute thread, not on the event loop)")
    if tensor.dtype not in _NAMES:
        raise ValueError(f"dtype {tensor.dtype} cannot be sent; supported: {', '.join(DTYPES)}")
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, dtype=np.uint8)


def iter_parts(tensor: torch.Tensor, part_bytes: int = DEFAULT_PART_BYTES) -> Iterator[runtime_pb2.Tensor]:
    """Yield the wire parts of ``tensor`` lazily: a header part, then raw parts of ≤ ``part_bytes``."""
    if part_bytes < 1:
        raise ValueError(f"part_bytes must be >= 1, got {part_bytes}")
    raw = memoryview(_raw_bytes(tensor))
    n_parts = max(1, math.ceil(len(raw) / part_bytes))
    yield runtime_pb2.Tensor(buffer=raw[:part_bytes].tobytes(), size=list(tensor.shape),
                             dtype=_NAMES[tensor.dtype], requires_grad=False,
                             compression=runtime_pb2.CompressionType.NONE, chunks=n_parts)
    for start in range(part_bytes, len(raw), part_bytes):
        yield runtime_pb2.Tensor(buffer=raw[start:start + part_bytes].tobytes())


def count_parts(tensor: torch.Tensor, part_bytes: int = DEFAULT_PART_BYTES) -> int:
    return max(1, math.ceil(tensor_nbytes(tensor) / part_bytes))


class TensorAssembler:
    """Rebuilds one tensor from its parts, validating the untrusted header and every part size."""

    def __init__(self, max_bytes: int, peer_id: str = ""):
        self.max_bytes = max_bytes
        self.peer_id = peer_id
        self.expected_bytes = -1
        self.received_bytes = 0
        self._out: torch.Tensor | None = None
        self._bytes: np.ndarray = np.empty(0, dtype=np.uint8)

    @property
    def complete(self) -> bool:
        return self._out is not None and self.received_bytes == self.expected_bytes

    def _fail(self, message: str) -> ProtocolError:
        return ProtocolError(message, self.peer_id)

    def _start(self, header: runtime_pb2.Tensor) -> None:
        if header.compression != runtime_pb2.CompressionType.NONE:
            raise self._fail(f"compressed tensors are not accepted (compression={header.compression})")
        dtype = DTYPES.get(header.dtype)
        if dtype is None:
            raise self._fail(f"unsupported dtype {header.dtype[:32]!r}")
        shape = tuple(int(d) for d in header.size)
        if len(shape) > MAX_NDIM:
            raise self._fail(f"tensor rank {len(shape)} exceeds {MAX_NDIM}")
        numel = math.prod(shape)
        nbytes = numel * torch.empty(0, dtype=dtype).element_size()
        if nbytes > self.max_bytes:
            raise self._fail(f"tensor of {nbytes} bytes exceeds the {self.max_bytes} byte limit")
        self.expected_bytes = nbytes
        self._out = torch.empty(shape, dtype=dtype)
        self._bytes = self._out.reshape(-1).view(torch.uint8).numpy() if numel else np.empty(0, np.uint8)

    def add(self, part: runtime_pb2.Tensor) -> bool:
        """Take the next part; returns True once the tensor is complete."""
        if self._out is None:
            if not part.dtype:
                raise self._fail("the first part of a tensor must carry its header (dtype, size)")
            self._start(part)
        elif part.dtype or part.size:
            raise self._fail("header fields in a continuation part (a second tensor?)")
        size = len(part.buffer)
        if self.received_bytes + size > self.expected_bytes:
            raise self._fail(f"tensor data overruns its header ({self.received_bytes + size} > "
                             f"{self.expected_bytes} bytes)")
        if size:
            self._bytes[self.received_bytes:self.received_bytes + size] = np.frombuffer(part.buffer, np.uint8)
            self.received_bytes += size
        return self.complete

    def tensor(self) -> torch.Tensor:
        """The rebuilt tensor; ``ProtocolError`` if parts are missing."""
        if self._out is None or not self.complete:
            raise self._fail(f"tensor incomplete: {self.received_bytes} of {self.expected_bytes} bytes")
        return self._out


def parts_to_tensor(parts: list[runtime_pb2.Tensor], max_bytes: int) -> torch.Tensor:
    """Rebuild a tensor from all its parts at once (tests and small messages)."""
    assembler = TensorAssembler(max_bytes)
    for part in parts:
        assembler.add(part)
    return assembler.tensor()
