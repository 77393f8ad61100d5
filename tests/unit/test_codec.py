"""Tensor codec (exact round trips, strict part validation) and the transport's wire metadata."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from hivemind.compression import serialize_torch_tensor
from hivemind.proto import runtime_pb2
from hivemind.utils.streaming import split_for_streaming
from hypothesis import given, settings
from hypothesis import strategies as st

from gwtfp2p.transport.codec import DTYPES, MAX_NDIM, TensorAssembler, count_parts, iter_parts, parts_to_tensor
from gwtfp2p.transport.errors import ProtocolError
from gwtfp2p.transport.messages import Ack, MicrobatchId, Reply, TransferMeta, parse_wire

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


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
@pytest.mark.parametrize("part_bytes", [1, 7, 64, MIB])
def test_round_trip_is_bit_exact(dtype, part_bytes):
    tensor = sample(dtype)
    parts = list(iter_parts(tensor, part_bytes))
    assert len(parts) == count_parts(tensor, part_bytes)
    assert exact(parts_to_tensor(parts, 10 * MIB), tensor)


def test_special_values_and_shapes_survive():
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-45, 3.4e38])
    assert exact(parts_to_tensor(list(iter_parts(special, 8)), MIB), special)
    for tensor in (torch.tensor(3.5), torch.empty(0, 4), torch.ones(1, 1, 1, 1, 1, 1, 1, 1)):
        assert exact(parts_to_tensor(list(iter_parts(tensor)), MIB), tensor)
    non_contiguous = torch.arange(24.0).reshape(4, 6).t()
    assert torch.equal(parts_to_tensor(list(iter_parts(non_contiguous, 16)), MIB), non_contiguous)
    with_grad = torch.ones(3, requires_grad=True)
    decoded = parts_to_tensor(list(iter_parts(with_grad)), MIB)
    assert torch.equal(decoded, with_grad.detach()) and not decoded.requires_grad


def test_sixteen_mib_fp32_in_one_mib_parts():
    tensor = torch.randn(4 * MIB, generator=torch.Generator().manual_seed(1))
    parts = list(iter_parts(tensor, MIB))
    assert len(parts) == 16 and all(len(p.buffer) == MIB for p in parts)
    assert parts[0].dtype == "float32" and list(parts[0].size) == [4 * MIB] and parts[0].chunks == 16
    assert all(not p.dtype and not p.size for p in parts[1:])
    assert torch.equal(parts_to_tensor(parts, 16 * MIB), tensor)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8])
def test_interoperates_with_hivemind_serializer(dtype):
    tensor = sample(dtype)
    hivemind_parts = list(split_for_streaming(serialize_torch_tensor(tensor), 50))
    assert exact(parts_to_tensor(hivemind_parts, MIB), tensor)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=0, max_size=4), part_bytes=st.integers(1, 200),
       dtype=st.sampled_from(list(DTYPES.values())), seed=st.integers(0, 2**16))
def test_round_trip_property(shape, part_bytes, dtype, seed):
    tensor = sample(dtype, tuple(shape), seed)
    assert exact(parts_to_tensor(list(iter_parts(tensor, part_bytes)), MIB), tensor)


def header(**fields) -> runtime_pb2.Tensor:
    base = dict(buffer=b"", size=[2], dtype="float32", compression=runtime_pb2.CompressionType.NONE)
    base.update(fields)
    return runtime_pb2.Tensor(**base)


@pytest.mark.parametrize("parts", [
    [runtime_pb2.Tensor(buffer=b"1234")],  # no header
    [header(dtype="object")],
    [header(dtype="complex64")],
    [header(compression=runtime_pb2.CompressionType.FLOAT16)],
    [header(size=[2] * (MAX_NDIM + 1))],
    [header(size=[1024, 1024, 1024])],  # 4 GiB > limit
    [header(buffer=b"x" * 9)],  # overruns 8 bytes
    [header(buffer=b"x" * 4), header(buffer=b"x" * 4)],  # a second header mid-tensor
    [header(buffer=b"x" * 4), runtime_pb2.Tensor(buffer=b"x" * 5)],
    [header(buffer=b"x" * 4)],  # incomplete
])
def test_assembler_rejects_malformed_parts(parts):
    with pytest.raises(ProtocolError):
        parts_to_tensor(parts, 16 * MIB)


def test_assembler_reports_completion_and_limit():
    tensor = torch.arange(6, dtype=torch.float32)
    assembler = TensorAssembler(max_bytes=24, peer_id=PEER)
    parts = list(iter_parts(tensor, 10))
    assert [assembler.add(p) for p in parts] == [False, False, True]
    assert torch.equal(assembler.tensor(), tensor)
    with pytest.raises(ProtocolError) as err:
        TensorAssembler(max_bytes=23, peer_id=PEER).add(parts[0])
    assert err.value.peer_id == PEER


def test_encoder_refuses_unsupported_input():
    with pytest.raises(ValueError):
        list(iter_parts(torch.ones(2, dtype=torch.complex64)))
    with pytest.raises(ValueError):
        list(iter_parts(torch.ones(2), part_bytes=0))


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
    for model in (TransferMeta, Reply, Ack):
        with contextlib.suppress(ProtocolError):
            parse_wire(model, raw)


def test_reply_envelope():
    reply = parse_wire(Reply, Reply(ack=Ack(duplicate=True)).model_dump_json().encode())
    assert reply.ok and reply.ack == Ack(duplicate=True)
    error = parse_wire(Reply, Reply.error("unavailable", "x" * 900).model_dump_json().encode())
    assert not error.ok and error.kind == "unavailable" and len(error.message) == 500
    with pytest.raises(ProtocolError):
        parse_wire(Reply, b'{"ok": false, "kind": "meltdown"}')
    with pytest.raises(ProtocolError):
        parse_wire(Reply, b"{" + b" " * 20000 + b"}")
