"""Fuzzing of every parser that reads a peer's bytes (issue 14): random bytes, random JSON and mutations of
valid messages go through each one; the only acceptable outcomes are a parsed value or the parser's typed
error. Parsers: the transport's headers and replies (``parse_wire``), tensor headers and lossy payloads,
the daemon's payloads (flow, control, recovery), aggregation messages, step-replay bytes, DHT records and
sealed values, a contribution's checks, and the inbox's guard on arbitrary metadata and tensors."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gwtfp2p.daemon.aggregation.vetting import check_contribution, check_tags
from gwtfp2p.daemon.lifecycle.guard import Guard, Shape
from gwtfp2p.daemon.steps_wire import decode_steps
from gwtfp2p.daemon.wire import (
    Closed,
    Lost,
    Member,
    WireError,
    decode_aggregation,
    decode_payload,
    encode_control,
    encode_recovery,
)
from gwtfp2p.dht.records import RecordError, parse_node_record, parse_run_spec_record
from gwtfp2p.dht.sealed import unseal
from gwtfp2p.model.aggregate import GradContribution
from gwtfp2p.transport import Ack, MicrobatchId, ProtocolError, TransferMeta
from gwtfp2p.transport.codec import TensorHeader
from gwtfp2p.transport.compression import decode as decode_lossy
from gwtfp2p.transport.messages import FetchRequest, Reply, StateHeader, TransferHeader, parse_wire

pytestmark = pytest.mark.timeout(300)
SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PEER = "12D3KooWEEKNFHzs7nSD3qG5DLxASVLuwVJ4WANjMzc1Y7r2bCKf"
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                                 max_size=5), max_leaves=20)
KEYS = ["version", "meta", "tensor", "microbatch", "data_holder", "iteration", "index", "stage", "flow_unit",
        "path", "attempt", "tags", "codec", "dtype", "shape", "ok", "kind", "ack", "state", "since_iteration",
        "op", "count", "bound", "origin", "epoch", "from_iteration", "until_iteration", "lost", "microbatches"]


def json_like() -> st.SearchStrategy[bytes]:
    """Random JSON with the protocols' own field names, and raw bytes."""
    objects = st.dictionaries(st.sampled_from(KEYS), JSON, max_size=8)
    return (objects.map(lambda o: json.dumps(o).encode()) | st.binary(max_size=300)
            | JSON.map(lambda o: json.dumps(o).encode()))


@st.composite
def _mutations(draw: st.DrawFn, valid: bytes) -> bytes:
    raw = bytearray(valid)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.integers(0, max(0, len(raw) - 1)))
        how = draw(st.sampled_from(["flip", "cut", "insert"]))
        if how == "flip" and raw:
            raw[where] ^= draw(st.integers(1, 255))
        elif how == "cut":
            del raw[where:where + draw(st.integers(1, 8))]
        else:
            raw[where:where] = draw(st.binary(min_size=1, max_size=8))
    return bytes(raw)


def mutated(valid: bytes) -> st.SearchStrategy[bytes]:
    """A valid encoding with bytes flipped, cut or inserted."""
    return _mutations(valid)


META = TransferMeta(microbatch=MicrobatchId(data_holder=PEER, iteration=3, index=1), stage=1, path=(PEER,),
                    tags={"kind": "grad", "op": "contrib", "count": 2, "bound": 5, "codec": "none"})
VALID_WIRE = {
    TransferHeader: TransferHeader(meta=META, tensor=TensorHeader(dtype="float32", shape=(2, 3))),
    Reply: Reply(ack=Ack()), StateHeader: StateHeader(stage=1, iteration=2, size_bytes=3, sha256="a" * 64),
    FetchRequest: FetchRequest(stage=1, since_iteration=4),
}


@SETTINGS
@given(st.sampled_from(sorted(VALID_WIRE, key=lambda m: m.__name__)), st.data())
def test_transport_messages_parse_or_refuse(model: type, data: st.DataObject) -> None:
    raw = data.draw(json_like() | mutated(VALID_WIRE[model].model_dump_json().encode()))
    with contextlib.suppress(ProtocolError):
        parse_wire(model, raw, PEER)


@SETTINGS
@given(st.data())
def test_daemon_payloads_parse_or_refuse(data: st.DataObject) -> None:
    valid = [encode_control(Member(stage=1, from_iteration=3)),
             encode_control(Closed(iteration=2, data_holders=(PEER,), loss=3.5)),
             encode_recovery(Lost(microbatch=META.microbatch, lost=PEER, stage=1))]
    raw = data.draw(st.sampled_from([b"F", b"C", b"R", b"X"]).flatmap(lambda tag: json_like().map(lambda b: tag + b))
                    | st.sampled_from(valid).flatmap(mutated))
    with contextlib.suppress(WireError):
        decode_payload(raw)


@SETTINGS
@given(st.dictionaries(st.sampled_from(["kind", "op", "count", "bound", "origin", "epoch", "codec", "loss_sum",
                                        "n_loss", "tokens", "sig0"]),
                       st.booleans() | st.integers(-5, 2**62) | st.floats(allow_nan=False, allow_infinity=False)
                       | st.text(max_size=10) | st.sampled_from(["contrib", "view", "query", "none", PEER]),
                       max_size=10))
def test_aggregation_messages_decode_or_refuse(tags: dict) -> None:
    meta = META.model_copy(update={"tags": tags})
    try:
        message = decode_aggregation(PEER, meta)
    except WireError:
        return
    if message.op == "contrib":
        check_tags(message.tags or {}, message.count, 32)


@SETTINGS
@given(json_like(), st.integers(0, 5), st.integers(0, 64))
def test_step_replays_decode_or_refuse(raw: bytes, first: int, numel: int) -> None:
    for data in (raw, raw + b"\n", b'{"format": 1, "steps": [' + raw + b"]}\n"):
        with contextlib.suppress(WireError):
            decode_steps(data, first_iteration=first, numel=numel)


@SETTINGS
@given(json_like())
def test_records_parse_or_refuse(raw: bytes) -> None:
    for parse in (parse_node_record, parse_run_spec_record):
        with contextlib.suppress(RecordError):
            parse(raw)
    with contextlib.suppress(RecordError):
        unseal(b"GWS1" + raw)


@SETTINGS
@given(st.sampled_from(["float16", "bfloat16", "blockwise8"]), st.binary(max_size=200), st.integers(0, 64))
def test_lossy_payloads_decode_or_refuse(codec: str, raw: bytes, numel: int) -> None:
    try:
        values = decode_lossy(raw, codec, torch.float32, (numel,))
    except ValueError:
        return
    assert values.shape == (numel,)


@SETTINGS
@given(st.integers(-3, 3), st.integers(-2, 2**62), st.integers(0, 40),
       st.sampled_from([torch.int64, torch.int32, torch.float32]), st.integers(-2**40, 2**40))
def test_contribution_checks_never_raise(count: int, bound: int, numel: int, dtype: torch.dtype, value: int) -> None:
    grad = torch.full((numel,), value).to(dtype)
    assert isinstance(check_contribution(GradContribution(PEER, grad, count, bound), 16), str)


class _Peers:
    def get(self, peer: str) -> object:
        return object()

    def serves(self, peer: str, stage: int) -> bool:
        return True


class _Kept:
    def get(self, key: str) -> None:
        return None


class _View:
    rounds = 0

    def poke(self) -> None:
        pass


GUARD = Guard(PEER, 1, 2, Shape(2, 4, 8, torch.float32, 4), peers=_Peers(), kept=_Kept(), prober=None,
              view=_View(), iteration=lambda: 3, refresh_s=0.0)


@SETTINGS
@given(st.lists(st.integers(0, 9), max_size=4), st.sampled_from([torch.float32, torch.float64, torch.int64,
                                                                  torch.float16]),
       st.sampled_from([0.0, math.nan, math.inf, 1e30]), st.integers(0, 9), st.integers(0, 2**53), st.integers(0, 3))
def test_the_guard_refuses_or_raises_a_typed_error(shape: list[int], dtype: torch.dtype, fill: float, index: int,
                                                   iteration: int, stage: int) -> None:
    tensor = torch.full(shape, fill).to(dtype) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)
    meta = TransferMeta(microbatch=MicrobatchId(data_holder=PEER, iteration=iteration, index=index), stage=stage)
    try:
        result = GUARD.forward(PEER, meta, tensor)
    except ProtocolError:
        return
    assert result is None or isinstance(result, Ack)
    if result is None:  # what passes is exactly the run's activation
        assert tuple(tensor.shape) == (2, 4, 8) and dtype == torch.float32 and math.isfinite(fill)
