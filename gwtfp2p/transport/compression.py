"""Wire codecs: a float tensor ↔ the bytes a run sends for it (``none``, ``float16``, ``bfloat16``, ``blockwise8``).

``encode`` is a pure, deterministic function of the tensor's values (CPU, IEEE arithmetic, round half to
even), so an output sent again (a retry, a recovery's resend) is the same bytes; ``decode`` gives every
receiver the same values from the same bytes. Formats (little-endian; sizes are
``gwtfp2p.config.encoded_bytes``): ``float16``: an int32 exponent ``e`` then the values × 2**e as float16,
``e`` putting the largest magnitude in [2**14, 2**15) (gradients keep their precision far below float16's
normal range); ``bfloat16``: the values rounded; ``blockwise8``: per block of ``BLOCKWISE8_BLOCK_VALUES``
values a bfloat16 scale ≈ absmax / 127, then every value as round(x / scale) in int8 (a block holding a
NaN or an infinity decodes as NaNs). ``none`` is the transport's exact raw encoding (``codec.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gwtfp2p.config import BLOCKWISE8_BLOCK_VALUES, FLOAT16_HEADER_BYTES, WIRE_CODECS, RunSpec, encoded_bytes

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
FLOAT16_TOP_EXPONENT = 15  # the largest magnitude lands in [2**14, 2**15): far from float16's 65504
FLOAT32_MAX_EXPONENT = 127


@dataclass(frozen=True)
class WireCodecs:
    """The run's codec for each kind of tensor it sends (``RunSpec.forward_codec`` and friends)."""

    forward: str = "none"
    backward: str = "none"
    aggregate: str = "none"

    def __post_init__(self) -> None:
        for name in (self.forward, self.backward, self.aggregate):
            _check_name(name)

    @classmethod
    def of(cls, spec: RunSpec) -> WireCodecs:
        return cls(spec.forward_codec, spec.backward_codec, spec.aggregate_codec)


def _check_name(codec: str) -> None:
    if codec not in WIRE_CODECS:
        raise ValueError(f"unknown wire codec {codec!r}; choose one of {', '.join(WIRE_CODECS)}")


def is_lossy(codec: str) -> bool:
    _check_name(codec)
    return codec != "none"


def wire_nbytes(codec: str, dtype: torch.dtype, numel: int) -> int:
    """Bytes ``numel`` values of ``dtype`` take on the wire under ``codec``."""
    _check_name(codec)
    return encoded_bytes(codec, numel, torch.empty(0, dtype=dtype).element_size())


def _check_encodable(tensor: torch.Tensor, codec: str) -> None:
    _check_name(codec)
    if tensor.device.type != "cpu":
        raise ValueError("move the tensor to CPU first (encoding runs where the transport sends)")
    if codec != "none" and tensor.dtype not in FLOAT_DTYPES:
        raise ValueError(f"the {codec} codec encodes float tensors, not {tensor.dtype}")


def encode(tensor: torch.Tensor, codec: str) -> torch.Tensor:
    """The wire bytes of ``tensor`` under a lossy ``codec``, as a flat uint8 CPU tensor."""
    _check_encodable(tensor, codec)
    if codec == "none":
        raise ValueError("the none codec sends the raw tensor (codec.iter_chunks), it has no encoding step")
    flat = tensor.detach().reshape(-1).to(torch.float32)
    if codec == "bfloat16":
        return flat.to(torch.bfloat16).view(torch.uint8)
    if codec == "float16":
        return _encode_float16(flat)
    return _encode_blockwise8(flat)


def decode(payload: torch.Tensor | bytes | bytearray | memoryview, codec: str, dtype: torch.dtype,
           shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor of ``dtype`` and ``shape`` that ``payload`` (``encode``'s bytes) stands for.

    ``ValueError`` if the payload's size does not match (a check on bytes from the network).
    """
    _check_name(codec)
    if codec == "none" or dtype not in FLOAT_DTYPES:
        raise ValueError(f"{codec} is not a lossy codec for {dtype}")
    raw = _as_uint8(payload)
    numel = math.prod(shape)
    expected = encoded_bytes(codec, numel, 4)
    if raw.numel() != expected:
        raise ValueError(f"a {codec} payload of {numel} values has {expected} bytes, got {raw.numel()}")
    if codec == "bfloat16":
        values = raw.view(torch.bfloat16).to(torch.float32)
    elif codec == "float16":
        values = _decode_float16(raw, numel)
    else:
        values = _decode_blockwise8(raw, numel)
    return values.to(dtype).reshape(shape)


def roundtrip(tensor: torch.Tensor, codec: str) -> torch.Tensor:
    """What a receiver gets for ``tensor`` (the tensor itself for ``none``)."""
    if codec == "none":
        _check_encodable(tensor, codec)
        return tensor
    return decode(encode(tensor, codec), codec, tensor.dtype, tuple(tensor.shape))


def _as_uint8(payload: torch.Tensor | bytes | bytearray | memoryview) -> torch.Tensor:
    if isinstance(payload, torch.Tensor):
        if payload.dtype != torch.uint8 or payload.dim() != 1:
            raise ValueError(f"a payload is a flat uint8 tensor, got {payload.dtype} {tuple(payload.shape)}")
        return payload.contiguous()
    if len(payload) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


def _peak(flat: torch.Tensor) -> float:
    """The largest magnitude (NaN if a value is NaN), without a temporary of the tensor's size
    (``amax`` and ``amin`` separately: ``torch.aminmax`` is many times slower on CPU)."""
    low, high = float(flat.amin()), float(flat.amax())
    return math.nan if math.isnan(low) or math.isnan(high) else max(-low, high)


def _float16_exponent(flat: torch.Tensor) -> int:
    """``e`` such that the largest magnitude × 2**e, as float16, lies in [2**14, 2**15) (0 for zeros or
    non-finite values). Decoded values give the same ``e`` again, so encoding them gives the same bytes."""
    if flat.numel() == 0:
        return 0
    peak = _peak(flat)
    if peak == 0.0 or not math.isfinite(peak):
        return 0
    _, k = math.frexp(peak)  # peak = m * 2**k, m in [0.5, 1)
    exponent = min(FLOAT16_TOP_EXPONENT - k, FLOAT32_MAX_EXPONENT)  # >= -113 since peak < 2**128
    rounded = float(torch.tensor(peak * 2.0 ** exponent, dtype=torch.float32).to(torch.float16))
    return exponent - 1 if rounded >= 2.0 ** FLOAT16_TOP_EXPONENT else exponent


def _encode_float16(flat: torch.Tensor) -> torch.Tensor:
    exponent = _float16_exponent(flat)
    out = torch.empty(FLOAT16_HEADER_BYTES + 2 * flat.numel(), dtype=torch.uint8)
    out[:FLOAT16_HEADER_BYTES] = torch.tensor([exponent], dtype=torch.int32).view(torch.uint8)
    values = out[FLOAT16_HEADER_BYTES:].view(torch.float16)
    if exponent:  # a power of two: exact in float32 while normal; one rounding, to float16
        torch.mul(flat, 2.0 ** exponent, out=values)
    else:
        values.copy_(flat)
    return out


def _decode_float16(raw: torch.Tensor, numel: int) -> torch.Tensor:
    exponent = int(raw[:FLOAT16_HEADER_BYTES].view(torch.int32)[0])
    if not -FLOAT32_MAX_EXPONENT <= exponent <= FLOAT32_MAX_EXPONENT:
        raise ValueError(f"float16 payload with an exponent out of range: {exponent}")
    values = raw[FLOAT16_HEADER_BYTES:].view(torch.float16).to(torch.float32)
    return values.mul_(2.0 ** -exponent) if exponent else values


def _blocks(flat: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """``flat`` as [n_blocks, BLOCKWISE8_BLOCK_VALUES], the last block padded with zeros (a copy only then)."""
    if flat.numel() == n_blocks * BLOCKWISE8_BLOCK_VALUES:
        return flat.view(n_blocks, BLOCKWISE8_BLOCK_VALUES)
    padded = torch.zeros(n_blocks * BLOCKWISE8_BLOCK_VALUES, dtype=torch.float32)
    padded[:flat.numel()] = flat
    return padded.view(n_blocks, BLOCKWISE8_BLOCK_VALUES)


def _encode_blockwise8(flat: torch.Tensor) -> torch.Tensor:
    numel = flat.numel()
    n_blocks = -(-numel // BLOCKWISE8_BLOCK_VALUES)
    out = torch.empty(encoded_bytes("blockwise8", numel, 4), dtype=torch.uint8)
    if numel == 0:
        return out
    blocks = _blocks(flat.contiguous(), n_blocks)
    peak = torch.maximum(blocks.amin(dim=1).neg_(), blocks.amax(dim=1))  # NaN where a value is NaN
    finite = torch.isfinite(peak)
    all_finite = bool(finite.all())
    scale = (peak / 127.0).to(torch.bfloat16)
    if not all_finite:
        scale.masked_fill_(~finite, math.nan)
    divisor = scale.to(torch.float32)
    divisor.masked_fill_(~(finite & (divisor > 0)), 1.0)
    q = torch.div(blocks, divisor[:, None]).round_().clamp_(-127, 127)
    if not all_finite:
        q.masked_fill_(~finite[:, None], 0.0)
    out[:2 * n_blocks] = scale.view(torch.uint8)
    out[2 * n_blocks:].view(torch.int8).copy_(q.view(-1)[:numel])
    return out


def _decode_blockwise8(raw: torch.Tensor, numel: int) -> torch.Tensor:
    n_blocks = -(-numel // BLOCKWISE8_BLOCK_VALUES)
    scale = raw[:2 * n_blocks].view(torch.bfloat16).to(torch.float32)
    q = raw[2 * n_blocks:].view(torch.int8).to(torch.float32)
    values = _blocks(q, n_blocks).mul_(scale[:, None])
    return values.view(-1)[:numel]
