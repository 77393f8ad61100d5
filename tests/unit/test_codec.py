"""Tensor codec (exact round trips, strict part validation) and the transport's wire metadata."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from hivemind.compression import serialize_torch_tensor
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gwtfp2p.transport.codec import (
    DTYPES,
    MAX_NDIM,
    TensorAssembler,
    TensorHeader,
    decode,
    iter_chunks,
    raw_bytes,
    tensor_header,
    tensor_nbytes,
)
from gwtfp2p.transport.errors import ProtocolError
from gwtfp2p.transport.messages import Ack, MicrobatchId, Reply, TransferHeader, TransferMeta, parse_wire

PEER = "12D3KooWEEKNFHzs7nSD3qG5DLxASVLuwVJ4WANjMzc1Y7r2bCKf"
MIB = 2**20
pytestmark = pytest.mark.timeout(60)


def sample(dtype: torch.dtype, shape=(3, 5, 7), seed=0) -> torch.Tensor:
    values = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 100
    return values > 0 if dtype == torch.bool else values.to(dtype)


def exact(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaN payloads and -0.0 included)."""
    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.detach().contiguous().reshape(-1).view(torch.uint8)

    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b))


def encode(tensor: torch.Tensor, part_bytes: int = MIB) -> tuple[TensorHeader, list[bytes]]:
    """What a sender puts on the wire: the header (as JSON and back) and the raw parts."""
    header = TensorHeader.model_validate_json(tensor_header(tensor).model_dump_json())
    return header, [bytes(chunk) for chunk in iter_chunks(tensor, part_bytes)]


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
@pytest.mark.parametrize("part_bytes", [1, 7, 64, MIB])
def test_round_trip_is_bit_exact(dtype, part_bytes):
    tensor = sample(dtype)
    header, parts = encode(tensor, part_bytes)
    assert len(parts) == -(-tensor_nbytes(tensor) // part_bytes) and header.nbytes == tensor_nbytes(tensor)
    assert exact(decode(header, parts, 10 * MIB), tensor)


def test_special_values_and_shapes_survive():
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45, 3.4e38])
    assert exact(decode(*encode(special, 8), MIB), special)
    for tensor in (torch.tensor(3.5), torch.empty(0, 4), torch.ones(1, 1, 1, 1, 1, 1, 1, 1)):
        assert exact(decode(*encode(tensor), MIB), tensor)
    non_contiguous = torch.arange(24.0).reshape(4, 6).t()
    assert torch.equal(decode(*encode(non_contiguous, 16), MIB), non_contiguous)
    with_grad = torch.ones(3, requires_grad=True)
    decoded = decode(*encode(with_grad), MIB)
    assert torch.equal(decoded, with_grad.detach()) and not decoded.requires_grad


def test_sixteen_mib_fp32_in_one_mib_parts_without_copies():
    tensor = torch.randn(4 * MIB, generator=torch.Generator().manual_seed(1))
    chunks = list(iter_chunks(tensor, MIB))
    assert len(chunks) == 16 and all(len(c) == MIB for c in chunks)
    assert chunks[0].obj is chunks[-1].obj  # views of one buffer, not copies
    header = tensor_header(tensor)
    assert header.dtype == "float32" and header.shape == (4 * MIB,) and header.nbytes == 16 * MIB
    assert torch.equal(decode(header, [bytes(c) for c in chunks], 16 * MIB), tensor)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool])
def test_raw_bytes_match_hivemind_serializer(dtype):
    tensor = sample(dtype)
    assert serialize_torch_tensor(tensor).buffer == bytes(raw_bytes(tensor))


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=0, max_size=4), part_bytes=st.integers(1, 200),
       dtype=st.sampled_from(list(DTYPES.values())), seed=st.integers(0, 2**16))
def test_round_trip_property(shape, part_bytes, dtype, seed):
    tensor = sample(dtype, tuple(shape), seed)
    assert exact(decode(*encode(tensor, part_bytes), MIB), tensor)


@pytest.mark.parametrize("header", [
    {"dtype": "object", "shape": [2]},
    {"dtype": "complex64", "shape": [2]},
    {"dtype": "float32", "shape": [2] * (MAX_NDIM + 1)},
    {"dtype": "float32", "shape": [-1]},
    {"dtype": "float32", "shape": [2.0]},
    {"dtype": "float32", "shape": "2"},
    {"dtype": "float32", "shape": [2], "compression": "FLOAT16"},
])
def test_headers_are_validated(header):
    with pytest.raises(ValidationError):
        TensorHeader.model_validate_json(json.dumps(header))


@pytest.mark.parametrize("chunks", [[b"x" * 9], [b"x" * 4, b"x" * 5], [b"x" * 4], []])
def test_assembler_rejects_overruns_and_missing_bytes(chunks):
    with pytest.raises(ProtocolError):
        decode(TensorHeader(dtype="float32", shape=(2,)), chunks, MIB)


def test_assembler_enforces_the_size_limit_before_allocating():
    with pytest.raises(ProtocolError) as err:
        TensorAssembler(TensorHeader(dtype="float32", shape=(1024, 1024, 1024)), max_bytes=16 * MIB, peer_id=PEER)
    assert err.value.peer_id == PEER


def test_assembler_reports_completion():
    tensor = torch.arange(6, dtype=torch.float32)
    assembler = TensorAssembler(tensor_header(tensor), max_bytes=24, peer_id=PEER)
    _, parts = encode(tensor, 10)
    assert [assembler.add(p) for p in parts] == [False, False, True]
    assert assembler.remaining_bytes == 0 and torch.equal(assembler.tensor(), tensor)


def test_encoder_refuses_unsupported_input():
    with pytest.raises(ValueError):
        tensor_header(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError):
        list(iter_chunks(torch.ones(2), part_bytes=0))
    with pytest.raises(ValueError):
        tensor_header(torch.ones([1] * (MAX_NDIM + 1)))


def meta_json(**fields) -> bytes:
    meta = TransferMeta(microbatch=MicrobatchId(data_holder=PEER, iteration=3, index=1), stage=2,
                        flow_unit="u7", path=(PEER,), attempt=1, tags={"seq": 4, "note": "x", "f": 0.5})
    data = json.loads(meta.model_dump_json())
    data.update(fields)
    return json.dumps(data).encode()


def test_transfer_meta_round_trip():
    meta = parse_wire(TransferMeta, meta_json())
    assert meta.microbatch.key == f"{PEER}/3/1" and meta.tags == {"seq": 4, "note": "x", "f": 0.5}
    assert parse_wire(TransferMeta, meta.model_dump_json().encode()) == meta


@pytest.mark.parametrize("fields", [
    {"stage": -1}, {"stage": "2"}, {"version": 2}, {"attempt": 10**6}, {"path": ["bad peer"]},
    {"path": [PEER] * 65}, {"tags": {f"k{i}": i for i in range(17)}}, {"tags": {"bad key!": 1}},
    {"tags": {"k": [1, 2]}}, {"tags": {"k": "v" * 200}}, {"flow_unit": "\n"}, {"extra": 1},
    {"microbatch": {"data_holder": PEER, "iteration": -1, "index": 0}},
])
def test_transfer_meta_rejects_bad_fields(fields):
    with pytest.raises(ProtocolError):
        parse_wire(TransferMeta, meta_json(**fields), PEER)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_wire_parsing_raises_only_protocol_error(raw):
    for model in (TransferMeta, TransferHeader, Reply, Ack):
        with contextlib.suppress(ProtocolError):
            parse_wire(model, raw)


def test_transfer_header_round_trip_and_validation():
    meta = parse_wire(TransferMeta, meta_json())
    header = TransferHeader(meta=meta, tensor=TensorHeader(dtype="bfloat16", shape=(2, 3)))
    assert parse_wire(TransferHeader, header.model_dump_json().encode()) == header
    bad = json.loads(header.model_dump_json())
    bad["tensor"]["dtype"] = "object"
    with pytest.raises(ProtocolError):
        parse_wire(TransferHeader, json.dumps(bad).encode())


def test_reply_envelope():
    reply = parse_wire(Reply, Reply(ack=Ack(duplicate=True)).model_dump_json().encode())
    assert reply.ok and reply.ack == Ack(duplicate=True)
    error = parse_wire(Reply, Reply.error("unavailable", "x" * 900).model_dump_json().encode())
    assert not error.ok and error.kind == "unavailable" and len(error.message) == 500
    with pytest.raises(ProtocolError):
        parse_wire(Reply, b'{"ok": false, "kind": "meltdown"}')
    with pytest.raises(ProtocolError):
        parse_wire(Reply, b"{" + b" " * 20000 + b"}")
