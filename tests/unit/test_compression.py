"""Wire codecs (``transport/compression.py``): sizes, error bounds, determinism, non-finite values, hostile bytes."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.config import BLOCKWISE8_BLOCK_VALUES, WIRE_CODECS, ConfigError, RunSpec, encoded_bytes
from gwtfp2p.transport.compression import WireCodecs, decode, encode, roundtrip, wire_nbytes

pytestmark = pytest.mark.timeout(120)
LOSSY = [c for c in WIRE_CODECS if c != "none"]


def values(seed: int, shape=(4, 33, 48), scale: float = 1.0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize("codec", LOSSY)
@pytest.mark.parametrize("numel", [0, 1, 63, 64, 65, 1000, 4096])
def test_encoded_size_is_the_configured_size(codec, numel):
    payload = encode(values(numel, (numel,)), codec)
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    assert payload.numel() == encoded_bytes(codec, numel, 4) == wire_nbytes(codec, torch.float32, numel)


def test_sizes_per_value():
    n = 768 * 1024 * 4
    assert wire_nbytes("none", torch.float32, n) == 4 * n
    assert wire_nbytes("float16", torch.float32, n) == 2 * n + 4
    assert wire_nbytes("bfloat16", torch.float32, n) == 2 * n
    assert wire_nbytes("blockwise8", torch.float32, n) == n + 2 * n // BLOCKWISE8_BLOCK_VALUES
    with pytest.raises(ConfigError, match="--codec"):
        encoded_bytes("zstd", n, 4)


@pytest.mark.parametrize("codec", LOSSY)
def test_decode_gives_shape_and_dtype_back(codec):
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = values(1).to(dtype)
        y = roundtrip(x, codec)
        assert y.dtype == dtype and y.shape == x.shape


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), log_scale=st.integers(-30, 30))
def test_error_bounds(seed, log_scale):
    """bfloat16: relative 2**-8; float16: relative 2**-11 above the scaled range's normal floor;
    blockwise8: half a step (absmax / 254, the bfloat16 scale rounding included) per block."""
    x = values(seed, (3, 70, 64), 2.0 ** log_scale)
    bf = roundtrip(x, "bfloat16")
    assert torch.all((bf - x).abs() <= x.abs() * 2**-8)
    f16 = roundtrip(x, "float16")
    peak = float(x.abs().max())
    floor = peak * 2**-28  # float16's normal range starts 2**29 below [2**14, 2**15)
    assert torch.all((f16 - x).abs() <= torch.clamp(x.abs(), min=floor) * 2**-11)
    b8 = roundtrip(x, "blockwise8")
    blocks = x.reshape(-1, BLOCKWISE8_BLOCK_VALUES)
    step = blocks.abs().amax(dim=1, keepdim=True) / 127
    err = (b8.reshape(-1, BLOCKWISE8_BLOCK_VALUES) - blocks).abs()
    assert torch.all(err <= step * (0.5 + 2**-7) + 1e-45)


def test_tiny_gradients_keep_float16_precision():
    """Activation gradients are far below float16's normal range: the tensor's scale keeps them."""
    g = values(3) * 1e-9
    assert torch.allclose(roundtrip(g, "float16"), g, rtol=2**-10, atol=0)
    assert float((g.half().float() - g).abs().max()) > 1e-10  # a plain cast would flush them


@pytest.mark.parametrize("codec", LOSSY)
def test_encoding_is_deterministic_and_layout_independent(codec):
    x = values(4, (48, 40))
    again = x.t().contiguous().t()  # same values, other memory layout
    assert not again.is_contiguous()
    assert raw(encode(x, codec)) == raw(encode(x.clone(), codec)) == raw(encode(again, codec))


@pytest.mark.parametrize("codec", LOSSY)
def test_decoding_the_same_bytes_gives_the_same_bits(codec):
    payload = encode(values(5), codec)
    first = decode(payload, codec, torch.float32, (4, 33, 48))
    second = decode(bytes(raw(payload)), codec, torch.float32, (4, 33, 48))
    assert raw(first) == raw(second)


@pytest.mark.parametrize("codec", LOSSY)
def test_zeros_and_empty(codec):
    assert torch.equal(roundtrip(torch.zeros(5, 7), codec), torch.zeros(5, 7))
    assert roundtrip(torch.zeros(0, 3), codec).shape == (0, 3)


def test_non_finite_values_stay_non_finite():
    x = values(6, (4 * BLOCKWISE8_BLOCK_VALUES,))
    x[3], x[BLOCKWISE8_BLOCK_VALUES + 1] = math.nan, math.inf
    b8 = roundtrip(x, "blockwise8")
    assert torch.isnan(b8[:2 * BLOCKWISE8_BLOCK_VALUES]).all()  # the two blocks with them
    assert torch.isfinite(b8[2 * BLOCKWISE8_BLOCK_VALUES:]).all()
    for codec in ("float16", "bfloat16"):
        y = roundtrip(x, codec)
        assert torch.isnan(y[3]) and torch.isinf(y[BLOCKWISE8_BLOCK_VALUES + 1])


def test_outlier_costs_only_its_own_block():
    x = values(7, (8 * BLOCKWISE8_BLOCK_VALUES,))
    x[0] = 1e4
    err = (roundtrip(x, "blockwise8") - x).abs()
    assert float(err[BLOCKWISE8_BLOCK_VALUES:].max()) < 0.05 and float(err[:BLOCKWISE8_BLOCK_VALUES].max()) > 1


@pytest.mark.parametrize("codec", LOSSY)
def test_wrong_sizes_are_refused(codec):
    payload = encode(values(8, (100,)), codec)
    for bad in (payload[:-1], torch.cat([payload, payload[:1]])):
        with pytest.raises(ValueError):
            decode(bad, codec, torch.float32, (100,))
    with pytest.raises(ValueError):
        decode(payload, codec, torch.int64, (100,))


def test_float16_exponent_out_of_range_is_refused():
    payload = encode(values(9, (10,)), "float16")
    payload[:4] = torch.tensor([100000], dtype=torch.int32).view(torch.uint8)
    with pytest.raises(ValueError, match="exponent"):
        decode(payload, "float16", torch.float32, (10,))


@settings(max_examples=40, deadline=None)
@given(data=st.binary(min_size=0, max_size=300), numel=st.integers(0, 100), codec=st.sampled_from(LOSSY))
def test_arbitrary_bytes_decode_or_raise_value_error(data, numel, codec):
    try:
        out = decode(data, codec, torch.float32, (numel,))
    except ValueError:
        return
    assert out.shape == (numel,) and len(data) == encoded_bytes(codec, numel, 4)


def test_non_float_and_unknown_codecs_are_misuse():
    with pytest.raises(ValueError, match="float"):
        encode(torch.arange(10), "blockwise8")
    with pytest.raises(ValueError, match="unknown"):
        encode(values(0), "zstd")
    with pytest.raises(ValueError):
        WireCodecs(forward="zstd")


def test_run_spec_names_the_field_to_fix():
    codecs = WireCodecs.of(RunSpec(forward_codec="blockwise8", backward_codec="float16", aggregate_codec="bfloat16"))
    assert codecs == WireCodecs("blockwise8", "float16", "bfloat16")
    for field, flag in (("forward_codec", "--forward-codec"), ("backward_codec", "--backward-codec"),
                        ("aggregate_codec", "--aggregate-codec")):
        with pytest.raises(ConfigError, match=flag):
            RunSpec(**{field: "int4"})


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), log_scale=st.integers(-60, 60), codec=st.sampled_from(LOSSY))
def test_decoded_values_encode_to_the_same_bytes(seed, log_scale, codec):
    """Each codec is a projection: what a receiver decoded, sent on, travels as the same bytes."""
    x = values(seed, (5, 64, 7), 2.0 ** log_scale)
    x[0, 0, 0] = 2.0 ** log_scale * (2 - 2**-12)  # rounds up to the next power of two in float16
    once = roundtrip(x, codec)
    assert raw(encode(once, codec)) == raw(encode(x, codec))
